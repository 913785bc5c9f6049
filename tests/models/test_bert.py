"""BERT: bidirectionality, padding, the task heads and argument checks."""

import numpy as np
import pytest

from kzoo import models
from tests.models.tiny_models import NUM_CLASSES
from tests.models.tiny_models import TINY_CONFIG
from tests.models.tiny_models import bert_backbone
from tests.models.tiny_models import bert_inputs
from tests.models.tiny_models import padding_mask
from tests.models.tiny_models import task_batch
from tests.models.tiny_models import token_ids


def _numpy(outputs):
    return {key: np.asarray(value) for key, value in outputs.items()}


def test_outputs_at_real_tokens_are_independent_of_padding():
    backbone = bert_backbone()
    rng = np.random.default_rng(0)
    ids = token_ids(rng, batch=3, length=6)
    lengths = [6, 4, 2]
    short = _numpy(backbone(bert_inputs(ids, padding_mask(lengths, length=6))))
    # Six more padded positions, with arbitrary ids under the mask.
    padded = np.concatenate([ids, token_ids(rng, batch=3, length=6)], axis=1)
    mask = padding_mask(lengths, length=12)
    long = _numpy(backbone({**bert_inputs(padded, mask), "token_ids": padded}))
    np.testing.assert_allclose(long["pooled_output"], short["pooled_output"], atol=1e-5)
    for row, length in enumerate(lengths):
        np.testing.assert_allclose(
            long["sequence_output"][row, :length], short["sequence_output"][row, :length], atol=1e-5
        )


def test_every_position_sees_the_whole_sequence():
    backbone = bert_backbone()
    ids = token_ids(np.random.default_rng(1), batch=1)
    mask = np.ones_like(ids)
    before = np.asarray(backbone(bert_inputs(ids, mask))["sequence_output"])
    changed = ids.copy()
    changed[0, -1] = ids[0, -1] % 30 + 1
    after = np.asarray(backbone(bert_inputs(changed, mask))["sequence_output"])
    assert not np.allclose(before[0, 0], after[0, 0], atol=1e-4)


def test_segment_ids_change_the_output():
    backbone = bert_backbone()
    ids = token_ids(np.random.default_rng(2), batch=1)
    inputs = bert_inputs(ids, np.ones_like(ids))
    sentence_b = {**inputs, "segment_ids": np.ones_like(ids)}
    assert not np.allclose(
        np.asarray(backbone(inputs)["pooled_output"]), np.asarray(backbone(sentence_b)["pooled_output"])
    )


@pytest.mark.parametrize(
    "name, shape",
    [
        ("BertMaskedLM", (4, 3, TINY_CONFIG["vocabulary_size"])),
        ("BertClassifier", (4, NUM_CLASSES)),
        ("BertTokenClassifier", (4, 10, NUM_CLASSES)),
    ],
)
def test_task_output_shapes(name, shape):
    model, x, y, _ = task_batch(name)
    logits = model(x)
    assert tuple(logits.shape) == shape and logits.dtype == "float32"
    assert tuple(y.shape) == shape[:-1]


def test_masked_lm_logits_are_tied_to_the_token_table_with_a_bias():
    model, x, _, _ = task_batch("BertMaskedLM")
    table = model.backbone.embedding.embeddings
    head_variables = [v for v in model.trainable_variables if v.path.startswith("lm_head")]
    assert [v.path for v in head_variables] == ["lm_head/bias"]
    assert sum(v is table for v in model.trainable_variables) == 1
    backbone_count = model.backbone.count_params()
    hidden = TINY_CONFIG["hidden_dim"]
    # transform dense + LayerNorm + output bias; the output matrix is the table.
    assert (
        model.count_params() == backbone_count + hidden * hidden + hidden + 2 * hidden + TINY_CONFIG["vocabulary_size"]
    )


@pytest.mark.parametrize(
    "overrides, argument",
    [
        ({"vocabulary_size": -3}, "vocabulary_size"),
        ({"num_heads": 0}, "num_heads"),
        ({"hidden_dim": 15}, "hidden_dim"),  # not divisible by 2 heads
        ({"num_segments": 0}, "num_segments"),
        ({"max_sequence_length": "512"}, "max_sequence_length"),
        ({"dropout": -0.1}, "dropout"),
    ],
)
def test_invalid_config_names_the_argument(overrides, argument):
    with pytest.raises(ValueError, match=f"`{argument}`"):
        models.BertBackbone(**{**TINY_CONFIG, **overrides})


@pytest.mark.parametrize("task", [models.BertClassifier, models.BertTokenClassifier])
def test_invalid_task_arguments_are_named(task):
    backbone = bert_backbone()
    with pytest.raises(ValueError, match="`num_classes`"):
        task(backbone, num_classes=0)
    with pytest.raises(ValueError, match="`dropout`"):
        task(backbone, num_classes=2, dropout=2.0)
    with pytest.raises(ValueError, match="`backbone`"):
        task(models.GPTBackbone(**TINY_CONFIG), num_classes=2)
