"""Chat templates: a checkpoint's Jinja template rendered as transformers renders it, and the
token that ends a reply.

A chat model's tokenizer carries a Jinja template (`tokenizer_config.json`'s `chat_template`,
`chat_template.jinja`, a GGUF's `tokenizer.chat_template`) that turns a list of messages into the
prompt text the model was trained on. `render_chat_template` renders it in the environment
`transformers`' `apply_chat_template` sets up, so the prompt is the same string:

- Jinja's `ImmutableSandboxedEnvironment` with `trim_blocks` and `lstrip_blocks`, the `loopcontrols`
  extension (`{% break %}`, `{% continue %}`) and the `{% generation %}` tag (rendered as its body);
- `raise_exception(message)`, `strftime_now(format)`, a `tojson` filter that keeps non-ASCII
  characters and takes `indent`, `separators` and `sort_keys`, and `dict` / `namespace` without
  access to their internals;
- the variables `messages`, `tools` (None unless given), `documents` (None unless given),
  `add_generation_prompt`, the tokenizer's special tokens (`bos_token`, `eos_token`, ...) and any
  extra keyword (e.g. `enable_thinking`);
- messages as plain data: keys whose value is None dropped, a reply's reasoning also under
  `thinking` and `reasoning_content` (the names templates read).

A template comes from a downloaded file, so it is untrusted: the sandbox refuses attribute access
to Python internals (`''.__class__.__mro__`), and the error names the template's source.

Example:
>>> render_chat_template(
...     "{% for m in messages %}<|im_start|>{{ m.role }}\\n{{ m.content }}<|im_end|>\\n{% endfor %}"
...     "{% if add_generation_prompt %}<|im_start|>assistant\\n{% endif %}",
...     [{"role": "user", "content": "Hi!"}],
...     add_generation_prompt=True,
... )
'<|im_start|>user\\nHi!<|im_end|>\\n<|im_start|>assistant\\n'
"""

import dataclasses
import datetime
import functools
import json
from collections.abc import Mapping

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
import numpy as np

# Where a reply's reasoning may be given; templates read the first two.
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ValueError):
    """A chat template that does not render: a syntax error, an error it raises itself (a role it
    does not take, say), or an operation the sandbox refuses."""


def render_chat_template(
    template,
    messages,
    add_generation_prompt=False,
    special_tokens=None,
    tools=None,
    documents=None,
    source="the chat template",
    **kwargs,
):
    """The prompt text of `messages` under the Jinja chat `template`, as transformers'
    `apply_chat_template(messages, tokenize=False)` renders it.

    Args:
        template: str, the Jinja template.
        messages: list of dicts, each with a "role" and a "content" (a string, or a list of
            content blocks); a message with "tool_calls" may have no content.
        add_generation_prompt: bool, end with the header of the assistant's reply.
        special_tokens: dict, e.g. `{"bos_token": "<s>", "eos_token": "</s>"}`.
        tools: None or a list of JSON-schema dicts.
        documents: None or a list of dicts.
        source: str, where the template comes from (a file), named in errors.
        **kwargs: other template variables (e.g. `enable_thinking=False`).

    Returns:
        The rendered string.

    Raises:
        ValueError: for messages that are not a non-empty list of dicts with a role and a content.
        ChatTemplateError: for a template that does not render (naming `source`).
    """
    messages = [_aliased_reasoning(message) for message in _checked_messages(messages)]
    variables = {name: str(token) for name, token in (special_tokens or {}).items() if token is not None}
    variables.update(kwargs)
    compiled = _compile(template, source)
    try:
        return compiled.render(
            messages=_plain(messages),
            tools=_plain(tools),
            documents=_plain(documents),
            add_generation_prompt=bool(add_generation_prompt),
            **_plain(variables),
        )
    except jinja2.exceptions.SecurityError as error:
        raise ChatTemplateError(f"The sandbox refused an operation of {source}: {error}") from error
    except _Raised as error:
        raise ChatTemplateError(f"{source} refused the conversation: {error}") from error
    except jinja2.exceptions.TemplateError as error:
        raise ChatTemplateError(f"{source} failed on this conversation: {type(error).__name__}: {error}") from error


def end_of_turn_token(tokenizer):
    """The token that ends a reply under `tokenizer`'s chat template, or None.

    It is the first added token the template writes after an assistant message's content:
    `<|im_end|>` for ChatML (SmolLM2, Qwen), `<end_of_turn>` for Gemma, `<|eot_id|>` for Llama 3,
    the EOS token for templates that end a reply with it (Llama 2). None without a template, or
    when the template writes no added token there.

    Args:
        tokenizer: a `kzoo.models.HFTokenizer`.
    """
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return None
    marker = "kzoo reply marker"
    conversation = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": marker}]
    try:
        text = render_chat_template(template, conversation, special_tokens=tokenizer.special_tokens_map)
    except ChatTemplateError:
        return None
    if marker not in text:
        return None
    added = tokenizer.added_tokens()
    for token_id in np.asarray(tokenizer.tokenize(text[text.index(marker) + len(marker) :])).tolist():
        if token_id in added:
            return added[token_id]
    return None


def stop_token_ids(tokenizer):
    """The ids that end a generated reply: the EOS token and the template's end-of-turn token
    (`end_of_turn_token`), without repeats; empty if the tokenizer has neither.

    Args:
        tokenizer: a `kzoo.models.HFTokenizer`.
    """
    ids = [tokenizer.eos_token_id]
    end_of_turn = end_of_turn_token(tokenizer)
    if end_of_turn is not None:
        ids.append(tokenizer.token_to_id(end_of_turn))
    return list(dict.fromkeys(int(token_id) for token_id in ids if token_id is not None))


def _checked_messages(messages):
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, (list, tuple)):
        raise ValueError(
            f"`messages` must be a list of {{'role', 'content'}} dicts; received a {type(messages).__name__}."
        )
    if not messages:
        raise ValueError("`messages` is empty: a chat needs at least one message.")
    checked = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(
                f"Message {index} must be a dict with a 'role' and a 'content'; received a {type(message).__name__}."
            )
        # As transformers: a None value (OpenAI's `content=None`) is a missing key.
        message = {key: value for key, value in message.items() if value is not None}
        if not isinstance(message.get("role"), str):
            raise ValueError(f"Message {index} has no 'role' (a string such as 'user'): {message!r}.")
        if "content" not in message and "tool_calls" not in message:
            raise ValueError(f"Message {index} (role {message['role']!r}) has no 'content'.")
        checked.append(message)
    return checked


def _aliased_reasoning(message):
    reasoning = next((message[key] for key in _REASONING_KEYS if message.get(key) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def _plain(value):
    """`value` rebuilt from JSON types, so the template sees no object with methods of its own."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, np.generic):
        return _plain(value.item())
    if isinstance(value, Mapping):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: _plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
    return f"<{type(value).__name__}>"


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (marks a reply, for assistant masks): its body."""

    tags = {"generation"}

    def parse(self, parser):
        line = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(line)


class _Raised(jinja2.exceptions.TemplateError):
    """An error the template raises itself (`raise_exception`)."""


def _raise_exception(message):
    raise _Raised(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Not Jinja's own `tojson`, which escapes HTML characters.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):
    return datetime.datetime.now().strftime(format)


class _Dict:
    """`dict(...)` and `dict.fromkeys(...)` in a template, and nothing else of the type."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """Jinja's `namespace()`, refusing names that start with "_" (a way to CPython internals)."""

    def __init__(*args, **kwargs):
        self, *args = args
        attributes = dict(*args, **kwargs)
        for name in attributes:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attributes)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a namespace attribute may not start with '_': {name!r}")


@functools.cache
def _environment():
    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals.update(
        raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_Dict(), namespace=_Namespace
    )
    return environment


def _compile(template, source):
    if not isinstance(template, str) or not template:
        raise ChatTemplateError(f"{source} is not a chat template: {type(template).__name__} {template!r:.80}.")
    try:
        return _compiled(template)
    except jinja2.exceptions.TemplateSyntaxError as error:
        raise ChatTemplateError(f"{source} is not a valid Jinja template (line {error.lineno}): {error}") from error


@functools.lru_cache(maxsize=32)
def _compiled(template):
    return _environment().from_string(template)
