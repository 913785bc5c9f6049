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
to Python internals (`''.__class__.__mro__`), and every rendering is bounded, so that a hostile
template fails fast with a `ChatTemplateError` naming its source and the reason, where it would
otherwise hang or exhaust memory:

- time: a wall-clock budget (`TIME_LIMIT` seconds) and a step budget (`MAX_STEPS` loop iterations,
  calls, filters and operators), checked at every step, so two nested `range(100000)` loops stop;
- size: every string the template builds, and the text it writes (the prompt, with what macros and
  `{% set %}` blocks write), at most `MAX_CHARS` characters, a list at most `MAX_STEPS` items;
  `'x' * n`, `~`, `+`, `%`, `join`, `replace`, `center`, `indent`, `tojson`'s `indent` and the
  like are checked before the string is allocated;
- recursion: calls nested at most `MAX_DEPTH` deep (a macro that calls itself);
- `{% include %}`, `{% import %}` and `{% extends %}` refused (a chat template stands alone);
- a template that renders no text refused.

Real templates render in milliseconds, far inside these bounds; `render_chat_template` takes other
bounds as keyword arguments. Messages are checked before rendering: a role is a string, a content
a string or a list of typed parts (`{"type": "text", "text": ...}`, `{"type": "image", ...}`), and
no value is turned into text silently.

Example:
>>> render_chat_template(
...     "{% for m in messages %}<|im_start|>{{ m.role }}\\n{{ m.content }}<|im_end|>\\n{% endfor %}"
...     "{% if add_generation_prompt %}<|im_start|>assistant\\n{% endif %}",
...     [{"role": "user", "content": "Hi!"}],
...     add_generation_prompt=True,
... )
'<|im_start|>user\\nHi!<|im_end|>\\n<|im_start|>assistant\\n'
"""

import contextvars
import dataclasses
import datetime
import functools
import json
import math
import re
import string
import time
import warnings
import weakref
from collections.abc import Mapping

import jinja2
import jinja2.compiler
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
import jinja2.utils
import numpy as np

from kzoo import _compat

# Where a reply's reasoning may be given; templates read the first two.
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")

# The bounds of one rendering, `render_chat_template`'s defaults (read at each call). Real
# templates take milliseconds, a few hundred steps and the length of the conversation; these leave
# room for conversations far longer than any model's context.
# Seconds of wall clock.
TIME_LIMIT = 5.0
# Loop iterations, calls, filters and operators (also the most items of a list the template builds).
MAX_STEPS = 1_000_000
# Characters of a string the template builds, and of all the text it writes (8 M: two million
# tokens, a few tens of MB).
MAX_CHARS = 8_000_000
# Calls nested in calls (a macro calling a macro...).
MAX_DEPTH = 64
# `tojson`'s indent, in spaces (templates use 2 or 4).
_MAX_INDENT = 100
# The bits of an integer the template computes (Python prints at most 4,300 digits, ~14,000 bits).
_MAX_INT_BITS = 16_384


class ChatTemplateError(ValueError):
    """A chat template that does not render: a syntax error, an error it raises itself (a role it
    does not take, say), an operation the sandbox refuses, or one over the rendering's bounds
    (time, size, recursion)."""


def render_chat_template(
    template,
    messages,
    add_generation_prompt=False,
    special_tokens=None,
    tools=None,
    documents=None,
    source="the chat template",
    time_limit=None,
    max_steps=None,
    max_chars=None,
    max_depth=None,
    **kwargs,
):
    """The prompt text of `messages` under the Jinja chat `template`, as transformers'
    `apply_chat_template(messages, tokenize=False)` renders it, within bounds of time, size and
    recursion (see the module's docstring).

    Args:
        template: str, the Jinja template.
        messages: list of dicts, each with a "role" (a string) and a "content": a string, or a
            list of typed parts (`{"type": "text", "text": "..."}`, `{"type": "image", ...}`); a
            message with "tool_calls" may have no content.
        add_generation_prompt: bool, end with the header of the assistant's reply.
        special_tokens: dict, e.g. `{"bos_token": "<s>", "eos_token": "</s>"}`.
        tools: None or a list of JSON-schema dicts.
        documents: None or a list of dicts.
        source: str, where the template comes from (a file), named in errors.
        time_limit: None (`TIME_LIMIT`, 5 s) or a number of seconds > 0, the wall-clock budget.
        max_steps: None (`MAX_STEPS`, 1,000,000) or an int >= 1, the budget of loop iterations,
            calls, filters and operators, and the most items of a list the template builds.
        max_chars: None (`MAX_CHARS`, 8,000,000) or an int >= 1, the longest string the template
            builds and the most text it writes in all.
        max_depth: None (`MAX_DEPTH`, 64) or an int >= 1, how deep calls may nest.
        **kwargs: other template variables (e.g. `enable_thinking=False`): strings, numbers,
            booleans, None, and lists and dicts of them.

    Returns:
        The rendered string (never empty).

    Raises:
        ValueError: for messages that are not a non-empty list of dicts with a string role and a
            content of a type templates take, for template variables of other types, and for
            bounds out of range.
        ChatTemplateError: for a template that does not render, renders no text, or goes over a
            bound (naming `source` and the reason).
    """
    budget = _Budget(time_limit, max_steps, max_chars, max_depth)
    messages = [_aliased_reasoning(message) for message in _checked_messages(messages)]
    variables = {name: str(token) for name, token in (special_tokens or {}).items() if token is not None}
    variables.update(kwargs)
    variables = {
        **_plain_variables(variables),
        **_plain_variables({"messages": messages, "tools": tools, "documents": documents}),
        "add_generation_prompt": bool(add_generation_prompt),
    }
    compiled = _compile(template, source)
    budget.start()
    token = _BUDGET.set(budget)
    try:
        chunks = []
        for chunk in compiled.generate(**variables):
            budget.write(chunk)
            chunks.append(chunk)
        text = "".join(chunks)
    except jinja2.exceptions.SecurityError as error:
        raise ChatTemplateError(f"The sandbox refused an operation of {source}: {error}") from error
    except _Raised as error:
        raise ChatTemplateError(f"{source} refused the conversation: {error}") from error
    except _OverBudget as error:
        raise ChatTemplateError(f"{source} went over its bounds on this conversation: {error}") from error
    except RecursionError as error:
        raise ChatTemplateError(f"{source} failed on this conversation: it recursed too deeply ({error}).") from error
    except MemoryError as error:
        raise ChatTemplateError(f"{source} failed on this conversation: it ran out of memory.") from error
    except Exception as error:
        # TemplateError (an undefined variable...), and what a Python operation raises inside the
        # template: TypeError, OverflowError (`range(10**9)`), ZeroDivisionError...
        raise ChatTemplateError(f"{source} failed on this conversation: {type(error).__name__}: {error}") from error
    finally:
        _BUDGET.reset(token)
    if not text:
        raise ChatTemplateError(
            f"{source} rendered no text for this conversation: there is no prompt to give the model."
        )
    return text


def end_of_turn_token(tokenizer):
    """The token that ends a reply under `tokenizer`'s chat template, or None.

    It is the first added token the template writes after an assistant message's content:
    `<|im_end|>` for ChatML (SmolLM2, Qwen), `<end_of_turn>` for Gemma, `<|eot_id|>` for Llama 3,
    the EOS token for templates that end a reply with it (Llama 2). None without a template, or
    when the template writes no added token there.

    It is found once per tokenizer (by rendering a short conversation), and found again only when
    the tokenizer's template, special tokens or vocabulary change. Export and training find it
    without the user asking, so a template that fails on that conversation does not stop them:
    the answer is None, with a warning naming the template's source and the reason, unless the
    template refused the conversation itself (`raise_exception`). A hostile template fails within
    the bounds of `render_chat_template`.

    Args:
        tokenizer: a `kzoo.tokenizers.HFTokenizer`.
    """
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return None
    special_tokens = tokenizer.special_tokens_map
    # What the answer depends on; the backend is compared by identity (it is kept alive by the
    # tokenizer, so its id is not reused while the entry is valid).
    backend = getattr(tokenizer, "_backend", None)
    vocabulary_size = getattr(tokenizer, "vocabulary_size", None)
    key = (template, tuple(special_tokens.items()), id(backend), vocabulary_size() if backend is not None else None)
    try:
        cached = _END_OF_TURN.get(tokenizer)
    except TypeError:  # not weakly referable: found each time
        cached = None
    if cached is not None and cached[0] == key:
        return cached[1]
    token = _find_end_of_turn(tokenizer, template, special_tokens)
    try:
        _END_OF_TURN[tokenizer] = (key, token)
    except TypeError:
        pass
    return token


def stop_token_ids(tokenizer):
    """The ids that end a generated reply: the EOS token and the template's end-of-turn token
    (`end_of_turn_token`, found once per tokenizer), without repeats; empty if the tokenizer has
    neither.

    Args:
        tokenizer: a `kzoo.tokenizers.HFTokenizer`.
    """
    ids = [tokenizer.eos_token_id]
    end_of_turn = end_of_turn_token(tokenizer)
    if end_of_turn is not None:
        ids.append(tokenizer.token_to_id(end_of_turn))
    return list(dict.fromkeys(int(token_id) for token_id in ids if token_id is not None))


# tokenizer -> (what the answer depends on, `end_of_turn_token`'s answer).
_END_OF_TURN = weakref.WeakKeyDictionary()


def _find_end_of_turn(tokenizer, template, special_tokens):
    marker = "kzoo reply marker"
    conversation = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": marker}]
    source = getattr(tokenizer, "chat_template_source", "the tokenizer's chat_template")
    try:
        text = render_chat_template(template, conversation, special_tokens=special_tokens, source=source)
    except ChatTemplateError as error:
        if not isinstance(error.__cause__, _Raised):
            warnings.warn(
                f"No end-of-turn token for this tokenizer (replies end at its EOS token only): {error}", stacklevel=3
            )
        return None
    if marker not in text:
        return None
    added = tokenizer.added_tokens()
    for token_id in np.asarray(tokenizer.tokenize(text[text.index(marker) + len(marker) :])).tolist():
        if token_id in added:
            return added[token_id]
    return None


# The content parts' "type"s whose text is under "text".
_TEXT_PARTS = ("text", "input_text", "output_text")


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
        role = message.get("role")
        if role is None:
            raise ValueError(f"Message {index} has no 'role' (a string such as 'user'): {message!r:.200}.")
        if not isinstance(role, str):
            raise ValueError(
                f"Message {index} has a 'role' of type {type(role).__name__}; it must be a string such as 'user'."
            )
        if "content" not in message and "tool_calls" not in message:
            raise ValueError(f"Message {index} (role {role!r}) has no 'content'.")
        if "content" in message:
            _check_content(message["content"], index, role)
        checked.append(message)
    return checked


def _check_content(content, index, role):
    """A message's content as transformers' templates take it: a string, or a list of typed parts."""
    where = f"Message {index} (role {role!r})"
    if isinstance(content, str):
        return
    if not isinstance(content, (list, tuple)):
        raise ValueError(
            f"{where} has a 'content' of type {type(content).__name__}; it must be a string or a list of typed "
            "parts such as {'type': 'text', 'text': '...'} or {'type': 'image', ...}."
        )
    for number, part in enumerate(content):
        if not isinstance(part, Mapping):
            raise ValueError(
                f"{where}: content part {number} is a {type(part).__name__}; a part must be a dict with a 'type', "
                "such as {'type': 'text', 'text': '...'}."
            )
        kind = part.get("type")
        if not isinstance(kind, str):
            raise ValueError(
                f"{where}: content part {number} has {'no' if kind is None else 'a non-string'} 'type' "
                f"({type(kind).__name__}); a part is typed, such as {{'type': 'text', 'text': '...'}}."
            )
        if kind in _TEXT_PARTS and not isinstance(part.get("text"), str):
            raise ValueError(
                f"{where}: content part {number} (type {kind!r}) has a 'text' of type "
                f"{type(part.get('text')).__name__}; it must be a string."
            )


def _aliased_reasoning(message):
    reasoning = next((message[key] for key in _REASONING_KEYS if message.get(key) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def _plain_variables(variables):
    """The template variables rebuilt from plain data (`_plain`), naming the one that is not."""
    plain = {}
    for name, value in variables.items():
        try:
            plain[name] = _plain(value)
        except _NotPlain as error:
            path = name + "".join(f"[{key!r}]" for key in reversed(error.path))
            raise ValueError(
                f"The chat template variable `{path}` is a {type(error.value).__name__}: a template takes strings, "
                "numbers, booleans, None, and lists and dicts of them."
            ) from None
        except RecursionError:
            raise ValueError(f"The chat template variable `{name}` is nested too deeply.") from None
    return plain


class _NotPlain(Exception):
    """A value `_plain` does not take; `path` is the keys to it, innermost first."""

    def __init__(self, value):
        super().__init__(type(value).__name__)
        self.value, self.path = value, []


def _plain(value):
    """`value` rebuilt from JSON types, so the template sees no object with methods of its own;
    `_NotPlain` for another type (bytes, a set, an array...), which is not turned into text."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, np.generic) and isinstance(value.item(), (bool, int, float, str)):
        return _plain(value.item())
    if isinstance(value, Mapping):
        plain = {}
        for key, item in value.items():
            try:
                plain[_plain(key)] = _plain(item)
            except _NotPlain as error:
                error.path.append(key)
                raise
        return plain
    if isinstance(value, (list, tuple)):
        plain = []
        for number, item in enumerate(value):
            try:
                plain.append(_plain(item))
            except _NotPlain as error:
                error.path.append(number)
                raise
        return plain if isinstance(value, list) else tuple(plain)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain({field.name: getattr(value, field.name) for field in dataclasses.fields(value)})
    raise _NotPlain(value)


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
    budget = _budget()
    # An indent is written once per level per line: `indent=10**9` would allocate gigabytes.
    width = len(indent) if isinstance(indent, str) else indent
    if isinstance(width, int) and width > _MAX_INDENT:
        raise _OverBudget(f"tojson's indent must be at most {_MAX_INDENT} (spaces); it is {width:,}.")
    budget.check_text(value, "the value given to tojson")
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):
    # A directive ("%c") writes at most ~24 characters for its 2.
    if isinstance(format, str):
        _budget().check_chars(12 * len(format), "strftime_now's text")
    return datetime.datetime.now().strftime(format)


def _lipsum(n=5, html=True, min=20, max=100):
    """Jinja's `lipsum`, its work bounded (`lipsum(10**9)` would loop a billion times)."""
    if isinstance(n, int) and isinstance(max, int):
        _budget().step(n * max)
    return jinja2.utils.generate_lorem_ipsum(n, html, min, max)


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


class _OverBudget(Exception):
    """A rendering over one of its bounds (time, steps, size, depth); the message says which."""


class _Budget:
    """The bounds of one rendering and what is left of them; the environment's hooks charge it."""

    def __init__(self, time_limit=None, max_steps=None, max_chars=None, max_depth=None):
        self.time_limit = _checked_bound(TIME_LIMIT if time_limit is None else time_limit, "time_limit", float)
        self.max_steps = _checked_bound(MAX_STEPS if max_steps is None else max_steps, "max_steps", int)
        self.max_chars = _checked_bound(MAX_CHARS if max_chars is None else max_chars, "max_chars", int)
        self.max_depth = _checked_bound(MAX_DEPTH if max_depth is None else max_depth, "max_depth", int)
        self.steps_left, self.chars_left, self.depth = self.max_steps, self.max_chars, 0
        self.deadline = math.inf

    def start(self):
        self.deadline = time.monotonic() + self.time_limit

    def step(self, count=1):
        """Charges `count` steps, and checks the clock."""
        self.steps_left -= count
        if self.steps_left < 0:
            raise _OverBudget(
                f"it took more than {self.max_steps:,} steps (loop iterations, calls, filters and operators; "
                "`max_steps=` sets the bound)."
            )
        if time.monotonic() > self.deadline:
            raise _OverBudget(
                f"it ran for more than {self.time_limit:g} s (a loop that does not end?; `time_limit=` sets the bound)."
            )

    def write(self, chunk):
        """Charges text the template writes (to the prompt, a macro's result or a `{% set %}` block)."""
        self.chars_left -= len(chunk)
        if self.chars_left < 0:
            raise _OverBudget(
                f"it writes more than {self.max_chars:,} characters of text (`max_chars=` sets the bound)."
            )

    def check_chars(self, count, what):
        """Refuses a string of `count` characters before it is built."""
        if count > self.max_chars:
            raise _OverBudget(
                f"{what} would be {count:,} characters, more than {self.max_chars:,} (`max_chars=` sets the bound)."
            )

    def check_items(self, count, what):
        if count > self.max_steps:
            raise _OverBudget(
                f"{what} would have {count:,} items, more than {self.max_steps:,} (`max_steps=` sets the bound)."
            )

    def check_text(self, value, what):
        """Refuses to write `value` as text when its text would be longer than `max_chars`: a list
        of one list repeated can hold a billion characters in a few objects. The length is
        estimated from above, each container measured once however often it is held."""
        if isinstance(value, str):
            return self.check_chars(len(value), what)
        if not _is_container(value):
            return None
        # Post-order over the distinct containers: id -> their text's length (estimated).
        sizes, open_, stack = {}, set(), [value]
        while stack:
            item = stack[-1]
            if id(item) in sizes:
                stack.pop()
                continue
            children = _children(item)
            if id(item) not in open_:
                open_.add(id(item))
                stack.extend(child for child in children if _is_container(child) and id(child) not in sizes)
                continue
            # A container met again inside itself (a namespace holding itself) is written "[...]".
            size = 2 + sum(
                sizes.get(id(child), 5) if _is_container(child) else _scalar_size(child) for child in children
            )
            sizes[id(item)] = size
            stack.pop()
            if size > self.max_chars:
                self.check_chars(size, what)
            if len(sizes) % 1024 == 0:
                self.step(0)
        return None

    def checked(self, value):
        """`value`, a template's result, refused when it is longer than the bounds."""
        if isinstance(value, str):
            self.check_chars(len(value), "a string")
        elif isinstance(value, (list, tuple, Mapping)):
            self.check_items(len(value), "a list or dict")
        return value

    def enter(self):
        self.depth += 1
        if self.depth > self.max_depth:
            raise _OverBudget(
                f"its calls nest more than {self.max_depth} deep (a macro that calls itself without end?; "
                "`max_depth=` sets the bound)."
            )


def _is_container(value):
    return isinstance(value, (Mapping, list, tuple, jinja2.utils.Namespace))


def _children(container):
    if isinstance(container, Mapping):
        return [*container.keys(), *container.values()]
    if isinstance(container, jinja2.utils.Namespace):
        return [_compat.jinja_namespace_attributes(container)]
    return container


def _scalar_size(value):
    """About the length of `repr(value)` (with a separator), for a value that holds no other."""
    if isinstance(value, str):
        return len(value) + 4
    if isinstance(value, int):
        return value.bit_length() // 3 + 3
    return 26


def _checked_bound(value, name, kind):
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise ValueError(f"`{name}` must be a number of seconds > 0; received {value!r}.")
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be an int >= 1; received {value!r}.")
    return value


# The budget of the rendering under way in this thread (or task); None outside one.
_BUDGET = contextvars.ContextVar("kzoo_chat_template_budget", default=None)


def _budget():
    """The rendering's budget; outside a rendering (Jinja folding constants while it compiles), one
    with the default bounds and no clock."""
    budget = _BUDGET.get()
    return _Budget() if budget is None else budget


class _Buffer(list):
    """The list a macro, a `{% set %}` block or a filter block writes its text to, charging it."""

    __slots__ = ("_budget",)

    def __init__(self, budget):
        super().__init__()
        self._budget = budget

    def append(self, chunk):
        self._budget.write(chunk)
        list.append(self, chunk)

    def extend(self, chunks):
        chunks = tuple(chunks)
        for chunk in chunks:
            self._budget.write(chunk)
        list.extend(self, chunks)


class _BoundedCodeGenerator(jinja2.compiler.CodeGenerator):
    """Jinja's compiler, with hooks where a template's work happens without a call: each loop
    iteration, each `~`, and each text written to a buffer."""

    def buffer(self, frame):
        frame.buffer = self.temporary_identifier()
        self.writeline(f"{frame.buffer} = environment.kzoo_buffer()")

    def visit_For(self, node, frame):
        # The iterable passed through `environment.kzoo_iterate`, which charges each item a step
        # (Jinja takes no node types of its own: a call of an environment attribute).
        line = node.iter.lineno
        counted = jinja2.nodes.Call(
            jinja2.nodes.EnvironmentAttribute("kzoo_iterate", lineno=line), [node.iter], [], None, None, lineno=line
        )
        node = jinja2.nodes.For(
            node.target, counted, node.body, node.else_, node.test, node.recursive, lineno=node.lineno
        )
        super().visit_For(node, frame)

    @jinja2.compiler.optimizeconst
    def visit_Concat(self, node, frame):
        self.write("environment.kzoo_concat((")
        for argument in node.nodes:
            self.visit(argument, frame)
            self.write(", ")
        self.write("))")


class _BoundedEnvironment(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """transformers' sandbox, every call, filter, loop iteration and operator charged to the
    rendering's budget (`_Budget`), and the operators and methods that build large values
    checked before they build them."""

    code_generator_class = _BoundedCodeGenerator
    # The operators that build large values (`'x' * 10**9`, `2 ** 10**9`, `'%0999999999d' % 1`);
    # intercepted, they are not folded while the template compiles either.
    intercepted_binops = frozenset(("+", "*", "**", "%"))

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (Jinja's names: a call may pass self=)
        budget = _budget()
        budget.step()
        args, kwargs = _check_call(budget, __obj, args, kwargs)
        budget.enter()
        try:
            result = super().call(__context, __obj, *args, **kwargs)
        finally:
            budget.depth -= 1
        return budget.checked(result)

    def call_binop(self, context, operator, left, right):
        budget = _budget()
        budget.step()
        _check_binop(budget, operator, left, right)
        return budget.checked(super().call_binop(context, operator, left, right))

    def kzoo_iterate(self, iterable):
        budget = _budget()
        for item in iterable:
            budget.step()
            yield item

    def kzoo_concat(self, values):
        budget = _budget()
        budget.step()
        texts = []
        for value in values:
            if not isinstance(value, str):
                budget.check_text(value, "an operand of `~`")
            texts.append(str(value))
        budget.check_chars(sum(map(len, texts)), "a `~` concatenation")
        return "".join(texts)

    def kzoo_buffer(self):
        return _Buffer(_budget())


def _finalize(value):
    """What `{{ ... }}` writes: refused when its text would be too long, before it is made."""
    if not isinstance(value, (str, jinja2.Undefined)):
        _budget().check_text(value, "a value written by the template")
    return value


def _check_binop(budget, operator, left, right):
    if operator == "*":
        for sequence, count in ((left, right), (right, left)):
            if isinstance(sequence, (str, list, tuple)) and isinstance(count, int):
                if isinstance(sequence, str):
                    budget.check_chars(len(sequence) * max(count, 0), "a string repeated with `*`")
                else:
                    budget.check_items(len(sequence) * max(count, 0), "a list repeated with `*`")
        if isinstance(left, int) and isinstance(right, int):
            _check_int_bits(left.bit_length() + right.bit_length())
    elif operator == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            _check_int_bits(right * left.bit_length())
    elif operator == "+":
        if isinstance(left, str) and isinstance(right, str):
            budget.check_chars(len(left) + len(right), "a string joined with `+`")
        elif isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
            budget.check_items(len(left) + len(right), "a list joined with `+`")
    elif operator == "%" and isinstance(left, str):
        _check_percent_format(budget, left, right)


def _check_int_bits(bits):
    if bits > _MAX_INT_BITS:
        raise _OverBudget(f"an integer of about {bits:,} bits, more than {_MAX_INT_BITS:,}.")


# A `%` conversion: its width and precision, digits or "*" (taken from the arguments).
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")


def _check_percent_format(budget, text, arguments):
    """`text % arguments` refused before it is built when a width or precision makes it too long."""
    values = arguments if isinstance(arguments, tuple) else (arguments,)
    numbers = [value for value in values if isinstance(value, int)]
    for match in _PERCENT_SPEC.finditer(text):
        for number in match.groups():
            if number == "*":
                budget.check_chars(max(numbers, default=0), "a `%` conversion's width")
            elif number is not None:
                budget.check_chars(int(number[:12]), "a `%` conversion's width")
    values = tuple(arguments.values()) if isinstance(arguments, Mapping) else values
    for value in values:
        if not isinstance(value, (str, int, float)):
            budget.check_text(value, "a `%` argument")
    # A mapping's value may be written by several conversions: each counted as the longest.
    conversions = len(_PERCENT_SPEC.findall(text))
    longest = max((len(value) for value in values if isinstance(value, str)), default=0)
    budget.check_chars(len(text) + conversions * longest, "a `%` formatted string")


def _check_format(budget, text, args, kwargs):
    """`text.format(...)` refused before it is built when a field's width makes it too long."""
    try:
        fields = list(string.Formatter().parse(text))
    except ValueError:
        return  # `format` raises it
    values = [*args, *kwargs.values()]
    for value in values:
        if isinstance(value, Mapping):
            values.extend(value.values())
        if not isinstance(value, (str, int, float)):
            budget.check_text(value, "a `format` argument")
    for _, _, spec, _ in fields:
        if spec and "{" in spec:  # a width from the arguments
            budget.check_chars(max((value for value in values if isinstance(value, int)), default=0), "a width")
        for number in re.findall(r"\d+", spec or ""):
            budget.check_chars(int(number[:12]), "a `format` width")
    # An argument may be written by several fields: each counted as the longest.
    longest = max((len(value) for value in values if isinstance(value, str)), default=0)
    budget.check_chars(len(text) + len(fields) * longest, "a `format`ted string")


def _argument(args, kwargs, index, name, default=None):
    """A call's argument `name`, given at position `index` or by name."""
    return args[index] if len(args) > index else kwargs.get(name, default)


def _predicted_replace(budget, text, old, new, count):
    if isinstance(text, str) and isinstance(old, str) and isinstance(new, str):
        found = text.count(old) if old else len(text) + 1
        if isinstance(count, int) and count >= 0:
            found = min(found, count)
        budget.check_chars(len(text) + found * max(0, len(new) - len(old)), "a `replace`d string")


def _predicted_join(budget, separator, items, what):
    """`separator.join(items)` checked before it is built; the items as a list."""
    items = list(items)
    budget.check_items(len(items), what)
    if isinstance(separator, str):
        budget.check_chars(len(separator) * max(0, len(items) - 1), what)
    # The items' text, with a little more for each (a bound, not the length).
    budget.check_text(items, what)
    return items


def _check_call(budget, function, args, kwargs):
    """A call's arguments checked before the call builds a large string; `(args, kwargs)`, an
    iterator among them made a list."""
    # The sandbox wraps `str.format` when it is looked up; the wrapped method is the string's.
    method = getattr(function, "__wrapped__", function)
    text = getattr(method, "__self__", None)
    if not isinstance(text, str):
        return args, kwargs
    name = getattr(method, "__name__", "")
    if name in ("center", "ljust", "rjust", "zfill"):
        width = _argument(args, kwargs, 0, "width")
        if isinstance(width, int):
            budget.check_chars(width, f"str.{name}'s width")
    elif name == "expandtabs":
        size = _argument(args, kwargs, 0, "tabsize", 8)
        if isinstance(size, int):
            budget.check_chars(len(text) + text.count("\t") * max(size, 0), "str.expandtabs' result")
    elif name == "join" and args:
        args = (_predicted_join(budget, text, args[0], "a `join`ed string"), *args[1:])
    elif name == "replace":
        _predicted_replace(
            budget,
            text,
            _argument(args, kwargs, 0, "old"),
            _argument(args, kwargs, 1, "new"),
            _argument(args, kwargs, 2, "count", -1),
        )
    elif name == "format":
        _check_format(budget, text, args, kwargs)
    elif name == "format_map" and args and isinstance(args[0], Mapping):
        _check_format(budget, text, (), dict(args[0]))
    elif name == "translate" and args and isinstance(args[0], Mapping):
        longest = max((len(value) for value in args[0].values() if isinstance(value, str)), default=1)
        budget.check_chars(len(text) * longest, "a `translate`d string")
    return args, kwargs


def _check_center(budget, value, args, kwargs):
    width = _argument(args, kwargs, 0, "width", 80)
    if isinstance(width, int):
        budget.check_chars(width, "center's width")
    return value, args, kwargs


def _check_indent(budget, value, args, kwargs):
    width = _argument(args, kwargs, 0, "width", 4)
    width = len(width) if isinstance(width, str) else width
    if isinstance(value, str) and isinstance(width, int):
        budget.check_chars(len(value) + max(width, 0) * (value.count("\n") + 1), "an `indent`ed string")
    return value, args, kwargs


def _check_format_filter(budget, value, args, kwargs):
    if isinstance(value, str):
        _check_percent_format(budget, value, dict(kwargs) if kwargs else tuple(args))
    return value, args, kwargs


def _check_replace(budget, value, args, kwargs):
    old, new = _argument(args, kwargs, 0, "old"), _argument(args, kwargs, 1, "new")
    _predicted_replace(budget, value, old, new, _argument(args, kwargs, 2, "count"))
    return value, args, kwargs


def _check_join(budget, value, args, kwargs):
    separator = _argument(args, kwargs, 0, "d", "")
    if isinstance(value, jinja2.Undefined):
        return value, args, kwargs
    value = _predicted_join(budget, separator, value, "a `join`ed string")
    return value, args, kwargs


def _check_wordwrap(budget, value, args, kwargs):
    width = _argument(args, kwargs, 0, "width", 79)
    wrap = _argument(args, kwargs, 2, "wrapstring") or "\n"
    if isinstance(value, str) and isinstance(width, int) and isinstance(wrap, str):
        lines = len(value) // max(width, 1) + value.count("\n") + 1
        budget.check_chars(len(value) + lines * len(wrap), "a `wordwrap`ped string")
    return value, args, kwargs


def _check_batch(budget, value, args, kwargs):
    count, fill = _argument(args, kwargs, 0, "linecount"), _argument(args, kwargs, 1, "fill_with")
    if isinstance(count, int) and fill is not None:
        budget.check_items(count, "a `batch`")
    return value, args, kwargs


def _check_slice(budget, value, args, kwargs):
    count = _argument(args, kwargs, 0, "slices")
    if isinstance(count, int):
        budget.check_items(count, "a `slice`")
    return value, args, kwargs


def _check_sum(budget, value, args, kwargs):
    start = _argument(args, kwargs, 1, "start", 0)
    if isinstance(start, (str, list, tuple)) and not isinstance(value, jinja2.Undefined):
        # Sums of lists copy the total so far at each item: charged as the work it is.
        value = list(value)
        total = len(start) + sum(len(item) for item in value if isinstance(item, (str, list, tuple)))
        budget.check_items(total, "a `sum` of lists")
        budget.step(len(value) * total)
    return value, args, kwargs


# Filters that write their value as text: the value's text is checked first.
_TEXT_FILTERS = frozenset(
    (
        "capitalize",
        "e",
        "escape",
        "forceescape",
        "lower",
        "pprint",
        "safe",
        "string",
        "striptags",
        "title",
        "trim",
        "truncate",
        "upper",
        "urlencode",
        "urlize",
        "wordcount",
        "xmlattr",
    )
)
# Filters whose arguments can make a large value, checked before they run.
_FILTER_CHECKS = {
    "center": _check_center,
    "indent": _check_indent,
    "format": _check_format_filter,
    "replace": _check_replace,
    "join": _check_join,
    "wordwrap": _check_wordwrap,
    "batch": _check_batch,
    "slice": _check_slice,
    "sum": _check_sum,
}


def _bounded_filter(name, function):
    """`function`, a filter, charged a step, its arguments checked, its result bounded."""
    pass_arg = _compat.jinja_pass_arg(function)
    check = _FILTER_CHECKS.get(name)

    # A context filter is not folded while the template compiles (outside any budget).
    @jinja2.pass_context
    @functools.wraps(function)
    def bounded(context, value, *args, **kwargs):
        budget = _budget()
        budget.step()
        if check is not None:
            value, args, kwargs = check(budget, value, args, kwargs)
        elif name in _TEXT_FILTERS and not isinstance(value, str):
            budget.check_text(value, f"the value given to {name}")
        if pass_arg == "context":
            result = function(context, value, *args, **kwargs)
        elif pass_arg == "eval_context":
            result = function(context.eval_ctx, value, *args, **kwargs)
        elif pass_arg == "environment":
            result = function(context.environment, value, *args, **kwargs)
        else:
            result = function(value, *args, **kwargs)
        return budget.checked(result)

    return bounded


@functools.cache
def _environment():
    environment = _BoundedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
        finalize=_finalize,
        # No loader: `{% include %}`, `{% import %}` and `{% extends %}` are refused when compiling.
        loader=None,
    )
    environment.filters["tojson"] = _tojson
    environment.filters.update(
        {name: _bounded_filter(name, function) for name, function in environment.filters.items()}
    )
    environment.globals.update(
        raise_exception=_raise_exception,
        strftime_now=_strftime_now,
        dict=_Dict(),
        namespace=_Namespace,
        lipsum=_lipsum,
    )
    return environment


def _compile(template, source):
    if not isinstance(template, str) or not template:
        raise ChatTemplateError(f"{source} is not a chat template: {type(template).__name__} {template!r:.80}.")
    try:
        return _compiled(template)
    except jinja2.exceptions.TemplateSyntaxError as error:
        raise ChatTemplateError(f"{source} is not a valid Jinja template (line {error.lineno}): {error}") from error
    except _Included as error:
        raise ChatTemplateError(
            f"{source} uses {{% {error} %}}: a chat template must stand alone (there are no other templates to load)."
        ) from error
    except (RecursionError, MemoryError) as error:
        raise ChatTemplateError(
            f"{source} could not be compiled: {type(error).__name__} (nested too deeply?)."
        ) from error


class _Included(Exception):
    """A template that loads another one (`include`, `import`, `extends`); the message is the tag."""


# The statements that load another template, and their tags.
_LOADING = {
    jinja2.nodes.Include: "include",
    jinja2.nodes.Import: "import",
    jinja2.nodes.FromImport: "from ... import",
    jinja2.nodes.Extends: "extends",
}


@functools.lru_cache(maxsize=32)
def _compiled(template):
    environment = _environment()
    tree = environment.parse(template)
    for node in tree.find_all(tuple(_LOADING)):
        raise _Included(_LOADING[type(node)])
    return environment.from_string(tree)
