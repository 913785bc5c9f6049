"""`model.fit` on streams whose sequence length is only known per batch, dropout on.

`padded_batch`, bucketing and generators with `None` dimensions give batches of any
length, odd ones included. The recipes' default runs and most users' pipelines look like
this, while fixed-shape batches (what most tests feed) hide shape bugs in the fused
training path: an odd length once crashed every model with dropout
(`Incompatible shapes: [8,4,9,9] vs. [8,4,9,10]`).
"""

import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from kzoo import models
from kzoo.ops import dropout
from kzoo.ops import dropout_noise

VOCABULARY_SIZE = 40
BATCH = 4
# Odd and even, so that every parity meets the dropout noise's pairing of numbers.
LENGTHS = (7, 10, 5, 9, 3)
# Seq2seq: target lengths independent of the source lengths.
TARGET_LENGTHS = (4, 11, 6, 3, 8)
TINY = dict(vocabulary_size=VOCABULARY_SIZE, num_heads=2, hidden_dim=16, intermediate_dim=32, dropout=0.2)


def _ids(rng, length):
    return rng.integers(1, VOCABULARY_SIZE - 1, (BATCH, length)).astype("int32")


def _batches(name, seed=0):
    """`(model, [(x, y, sample_weight), ...])`, one batch per length, lengths varying."""
    rng = np.random.default_rng(seed)
    batches = []
    for length, target_length in zip(LENGTHS, TARGET_LENGTHS):
        ids = _ids(rng, length)
        mask = np.ones_like(ids)
        mask[-1, length // 2 :] = 0  # one padded row
        ids = ids * mask
        bert = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": mask}
        if name == "GPTCausalLM":
            batches.append(({"token_ids": ids, "padding_mask": mask}, np.roll(ids, -1, axis=1), mask))
        elif name == "BertMaskedLM":
            positions = np.stack([rng.permutation(length)[:2] for _ in range(BATCH)]).astype("int32")
            targets = np.take_along_axis(ids, positions, axis=1)
            batches.append(({**bert, "mask_positions": positions}, targets, (targets != 0).astype("int32")))
        elif name == "BertClassifier":
            batches.append((bert, rng.integers(0, 3, (BATCH,)).astype("int32"), np.ones((BATCH,), "int32")))
        elif name == "BertTokenClassifier":
            batches.append((bert, rng.integers(0, 3, ids.shape).astype("int32"), mask))
        elif name == "Seq2SeqTransformer":
            target = _ids(rng, target_length)
            x = {"encoder_token_ids": ids, "decoder_token_ids": target}
            batches.append((x, np.roll(target, -1, axis=1), np.ones_like(target)))
        elif name in ("RNNLanguageModel", "FeedForwardLanguageModel"):
            batches.append((ids, np.roll(ids, -1, axis=1), mask))
        elif name == "BiLSTMTagger":
            batches.append((ids, rng.integers(0, 3, ids.shape).astype("int32"), mask))
        elif name == "BiLSTMClassifier":
            batches.append((ids, rng.integers(0, 3, (BATCH,)).astype("int32"), np.ones((BATCH,), "int32")))
    return _model(name), batches


def _model(name):
    bert = dict(TINY, num_layers=1, max_sequence_length=16)
    recurrent = dict(vocabulary_size=VOCABULARY_SIZE, embedding_dim=8, hidden_dim=8, dropout=0.2)
    if name == "GPTCausalLM":
        return models.GPTCausalLM(models.GPTBackbone(**bert))
    if name == "BertMaskedLM":
        return models.BertMaskedLM(models.BertBackbone(**bert))
    if name == "BertClassifier":
        return models.BertClassifier(models.BertBackbone(**bert), num_classes=3)
    if name == "BertTokenClassifier":
        return models.BertTokenClassifier(models.BertBackbone(**bert), num_classes=3)
    if name == "Seq2SeqTransformer":
        config = dict(TINY, num_encoder_layers=1, num_decoder_layers=1, max_sequence_length=16)
        return models.Seq2SeqTransformer(models.Seq2SeqBackbone(**config))
    if name == "RNNLanguageModel":
        return models.RNNLanguageModel(**recurrent)
    if name == "FeedForwardLanguageModel":
        return models.FeedForwardLanguageModel(window_size=3, **recurrent)
    if name == "BiLSTMTagger":
        return models.BiLSTMTagger(num_labels=3, **recurrent)
    return models.BiLSTMClassifier(num_classes=3, **recurrent)


def _unknown_lengths(structure):
    """The `tf.TensorSpec` of a batch structure with every axis but the batch unknown."""
    return tf.nest.map_structure(lambda a: tf.TensorSpec((None,) * a.ndim, tf.as_dtype(a.dtype)), structure)


# The [CLS] pooler only serves sentence-level heads.
_UNUSED = {"BertMaskedLM": "pooler/", "BertTokenClassifier": "pooler/"}

TASKS = (
    "GPTCausalLM",
    "BertMaskedLM",
    "BertClassifier",
    "BertTokenClassifier",
    "Seq2SeqTransformer",
    "RNNLanguageModel",
    "FeedForwardLanguageModel",
    "BiLSTMTagger",
    "BiLSTMClassifier",
)


@pytest.mark.parametrize("name", TASKS)
def test_fit_with_dropout_on_batches_of_varying_length(name):
    model, batches = _batches(name)
    dataset = tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=_unknown_lengths(batches[0]))
    model.compile(learning_rate=1e-3)
    before = [ops.convert_to_numpy(w) for w in model.trainable_weights]
    history = model.fit(dataset.repeat(), epochs=2, steps_per_epoch=len(batches), verbose=0)
    losses = history.history["loss"]
    assert len(losses) == 2 and np.all(np.isfinite(losses)), losses
    unchanged = [
        w.path
        for w, b in zip(model.trainable_weights, before)
        if np.array_equal(ops.convert_to_numpy(w), b) and not w.path.startswith(_UNUSED.get(name, "-"))
    ]
    assert not unchanged, unchanged


@pytest.mark.parametrize("length", [1, 2, 7, 8])
def test_dropout_of_a_length_known_only_at_run_time(length):
    rate = 0.25

    @tf.function(input_signature=[tf.TensorSpec((None, None), tf.float32)])
    def drop(x):
        return dropout(x, dropout_noise(ops.shape(x), rate, seed=3), rate)

    x = tf.ones((4000, length))
    y = drop(x).numpy()
    assert y.shape == (4000, length)
    np.testing.assert_allclose(np.unique(y), [0.0, 1.0 / (1.0 - rate)], rtol=1e-6)
    # Every column is dropped at the rate, the last one of an odd length included.
    np.testing.assert_allclose((y == 0).mean(axis=0), rate, atol=0.03)
