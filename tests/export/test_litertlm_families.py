"""Every decoder family as a LiteRT-LM bundle: a tiny random `transformers` checkpoint of each,
loaded into kzoo and exported through the one serving interface, gives in Google's runtime the
greedy text of Keras and of `transformers` itself.

The families are GPT-2 and every decoder family kzoo writes (`hf_folders.DECODERS`, from the records
of `kzoo.checkpoints.families`). The default run exports Gemma 3 (sliding-window layers with a
window of 4 in a 64-slot cache, two RoPE bases, QK-norm, four norms per block); the other families
run with KZOO_SLOW=1.
"""

import numpy as np
import pytest
import torch

from kzoo import data
from kzoo import export
from kzoo import models
from kzoo.checkpoints.families import TINY_BASE
from kzoo.checkpoints.families import text_families
from kzoo.export import litertlm_model
from tests.models import hf_folders

CACHE_LENGTH = 64
# 42 characters: three prefill chunks, each longer than the sliding windows.
PROMPT = "ROMEO: But soft, what light through yonder"
NEW_TOKENS = 20
FAMILIES = [*text_families(), "gpt2"]
FAST_FAMILY = "gemma3_text"


def load_family(folder, family):
    """`(Keras model, transformers model)` of a tiny random checkpoint of `family`: the decoders
    with kzoo's character tokenizer, GPT-2 with its byte-level BPE."""
    if family == "gpt2":
        reference = hf_folders.write_gpt2(folder, "GPT2LMHeadModel", n_positions=CACHE_LENGTH)
        return models.GPTCausalLM.from_preset(str(folder)), reference
    reference = hf_folders.write_decoder(folder, family, max_position_embeddings=CACHE_LENGTH)
    tokenizer = data.character_tokenizer(TINY_BASE["vocab_size"])
    return models.CausalLM.from_preset(str(folder), tokenizer=tokenizer), reference


def transformers_greedy(model, prompt_ids, new_tokens, stop_token_ids):
    """Greedy continuation by full forward passes of the `transformers` model (no cache)."""
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(new_tokens):
            token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            if token in stop_token_ids:
                break
            ids.append(token)
    return ids[len(prompt_ids) :]


@pytest.mark.parametrize(
    "family", [pytest.param(family, marks=[] if family == FAST_FAMILY else pytest.mark.slow) for family in FAMILIES]
)
def test_the_bundle_gives_the_greedy_text_of_keras_and_transformers(family, tmp_path):
    lm, reference = load_family(tmp_path / "hf", family)
    if family == "gemma3_text":
        assert lm.backbone.sliding_window < CACHE_LENGTH // 8 and lm.backbone.query_key_norm
    # With the default cache spans (16 and 32 of 64 slots): every position's logits and the greedy
    # text, past the spans and past the sliding window, through each of the attention's branches.
    report = export.export(
        lm,
        tmp_path / "export",
        formats="litertlm",
        cache_length=CACHE_LENGTH,
        num_examples=4,
        latency_runs=1,
    )
    record = report["artifacts"]["litertlm"]
    assert record["cache_spans"] == [16, 32]
    bundle = tmp_path / "export" / record["path"]
    assert bundle.is_file() and bundle.stat().st_size == record["size_bytes"]
    # The exporter's checks, in the runtime: float32 logits over the whole cache, and greedy text
    # on prompts of 1, 7 and up to 48 tokens (a byte-level BPE prompt cut from a row can come
    # out shorter), the longest continued to the end of the cache.
    assert record["max_abs_diff"][str(CACHE_LENGTH)] <= record["tolerance"][str(CACHE_LENGTH)]
    assert record["quality"]["top1_agreement"] == 1.0
    assert record["tokenizer"]["matches_keras"] and record["generation"]["matches_keras"]
    cases = record["generation"]["cases"]
    assert max(case["prompt_tokens"] + case["new_tokens"] for case in cases) >= CACHE_LENGTH // 2

    runtime = litertlm_model.LiteRTLMModel(bundle)
    try:
        prompt_ids = runtime.start_token_ids + runtime.tokenize(PROMPT)
        stop = [token for tokens in runtime.stop_token_ids for token in tokens]
        expected = transformers_greedy(reference, prompt_ids, NEW_TOKENS, stop)
        text = runtime.generate(PROMPT, NEW_TOKENS, top_k=1)
    finally:
        runtime.close()
    assert text == lm.tokenizer.detokenize(expected) and len(expected) > 0
    assert np.asarray(lm.tokenizer(PROMPT)).tolist() == prompt_ids[len(runtime.start_token_ids) :]
