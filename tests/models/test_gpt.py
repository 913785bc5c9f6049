"""GPT-2's own settings: the tied output table and argument checks. Causality, padding, the cache,
ragged prompts, files, LoRA and int8 are the causal-LM contract (test_causal_lm.py), which GPT-2
runs with every decoder family."""

import numpy as np
import pytest

from kzoo import models
from tests.models.tiny_models import TINY_CONFIG
from tests.models.tiny_models import gpt_backbone
from tests.models.tiny_models import token_ids


def _lm_inputs(ids, mask=None):
    return {"token_ids": ids, "padding_mask": np.ones_like(ids) if mask is None else mask}


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
