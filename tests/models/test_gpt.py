"""GPT: causality, padding, the cached decoding path and argument checks."""

import numpy as np
import pytest
import tensorflow as tf

from kzoo import models
from tests.models.tiny_models import LENGTH
from tests.models.tiny_models import TINY_CONFIG
from tests.models.tiny_models import gpt_backbone
from tests.models.tiny_models import padding_mask
from tests.models.tiny_models import token_ids


def _lm_inputs(ids, mask=None):
    return {"token_ids": ids, "padding_mask": np.ones_like(ids) if mask is None else mask}


def test_output_at_t_is_independent_of_later_tokens():
    lm = models.GPTCausalLM(gpt_backbone())
    rng = np.random.default_rng(0)
    ids = token_ids(rng)
    logits = np.asarray(lm(_lm_inputs(ids)))
    for t in (0, 4, LENGTH - 2):
        changed = ids.copy()
        changed[:, t + 1 :] = token_ids(rng)[:, t + 1 :]
        changed_logits = np.asarray(lm(_lm_inputs(changed)))
        np.testing.assert_allclose(changed_logits[:, : t + 1], logits[:, : t + 1], atol=1e-6)
        assert not np.allclose(changed_logits[:, t + 1 :], logits[:, t + 1 :], atol=1e-3)


def test_outputs_at_real_tokens_are_independent_of_padding():
    backbone = gpt_backbone()
    rng = np.random.default_rng(1)
    ids = token_ids(rng, batch=2, length=6)
    short = np.asarray(backbone(_lm_inputs(ids)))
    # Longer, with arbitrary ids under the padding.
    padded = np.concatenate([ids, token_ids(rng, batch=2, length=6)], axis=1)
    long = np.asarray(backbone(_lm_inputs(padded, padding_mask([6, 6], length=12))))
    np.testing.assert_allclose(long[:, :6], short, atol=1e-5)


def test_cached_steps_match_the_full_pass():
    lm = models.GPTCausalLM(gpt_backbone())
    ids = token_ids(np.random.default_rng(2), batch=3, length=12)
    full = np.asarray(lm(_lm_inputs(ids)))

    logits, state = lm.prefill(ids[:, :5], cache_length=12)
    # Per block keys and values: (B, heads, cache_length, head_dim).
    assert {name: tuple(c.shape) for name, c in state.items()} == {
        f"{kind}_cache_{i}": (3, 2, 12, 8) for kind in ("key", "value") for i in range(2)
    }
    steps = [logits]
    # The decoding step as `generate` will run it: a graph with a tensor index.
    step = tf.function(lm.decode)
    for t in range(5, 12):
        logits, state = step(ids[:, t : t + 1], state, tf.constant(t))
        steps.append(logits)
    assert logits.dtype == "float32" and tuple(logits.shape) == (3, 1, lm.backbone.vocabulary_size)
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


@pytest.mark.parametrize("rows", [(1, 1), None])  # one row (E h) and a full batch (h E^T)
def test_logits_use_the_token_table(rows):
    lm = models.GPTCausalLM(gpt_backbone())
    ids = token_ids(np.random.default_rng(3))
    if rows:
        ids = ids[: rows[0], : rows[1]]
    hidden = lm.backbone(_lm_inputs(ids))
    table = lm.backbone.embedding.embeddings
    expected = np.einsum("btd,vd->btv", np.asarray(hidden), np.asarray(table))
    np.testing.assert_allclose(np.asarray(lm(_lm_inputs(ids))), expected, atol=1e-5)


@pytest.mark.parametrize(
    "overrides, argument",
    [
        ({"vocabulary_size": 0}, "vocabulary_size"),
        ({"num_layers": 1.5}, "num_layers"),
        ({"num_heads": 3}, "hidden_dim"),  # 16 is not divisible by 3
        ({"intermediate_dim": -1}, "intermediate_dim"),
        ({"max_sequence_length": None}, "max_sequence_length"),
        ({"dropout": 1.0}, "dropout"),
    ],
)
def test_invalid_config_names_the_argument(overrides, argument):
    with pytest.raises(ValueError, match=f"`{argument}`"):
        models.GPTBackbone(**{**TINY_CONFIG, **overrides})


def test_task_rejects_other_backbones():
    with pytest.raises(ValueError, match="`backbone`"):
        models.GPTCausalLM(models.BertBackbone(**TINY_CONFIG))


def test_sequences_longer_than_the_positions_fail():
    backbone = gpt_backbone()
    ids = np.ones((1, TINY_CONFIG["max_sequence_length"] + 1), "int32")
    with pytest.raises(ValueError, match="sequence_length"):
        backbone(_lm_inputs(ids))
