"""Tiny random-weight models of every exported family, inputs for them, and `export/export.py`."""

import importlib.util
from pathlib import Path

import keras
import numpy as np

from kzoo import models
from kzoo.checkpoints.families import FAMILIES
from tests.models.tiny_models import decoder_backbone

VOCABULARY_SIZE = 64
MAX_LENGTH = 16
TRANSFORMER = dict(num_heads=2, hidden_dim=16, intermediate_dim=32, max_sequence_length=MAX_LENGTH, dropout=0.0)
# The fewest checks an export may run: what the tests that run a whole export need.
QUICK = dict(num_examples=2, latency_runs=1, generate_tokens=2)


def load_export_command():
    """`export/export.py`, the command, as a module (it is a script, outside any package)."""
    path = Path(__file__).resolve().parents[2] / "export" / "export.py"
    spec = importlib.util.spec_from_file_location("export_command", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(family, vocabulary_size=VOCABULARY_SIZE, **transformer):
    """A tiny model of `family` ("gpt", "bert_classifier", "bert_tagger", "bert_masked_lm",
    "seq2seq", "rnn_lm", "feed_forward_lm", "bilstm_classifier", or a decoder family's
    `model_type`), every matrix drawn anew (see `redraw`)."""
    return redraw(_build(family, vocabulary_size, **transformer))


def redraw(model, seed=0):
    """Draws every weight matrix of `model` anew, N(0, its initial std).

    kzoo's transformer blocks give all their kernels one unseeded initializer instance,
    which in Keras 3 draws the same values for each (Q = K = V = W^O at initialization);
    the TFLite converter then stores the identical matrices once, which would flatter the
    float32 file sizes these tests compare with.
    """
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        if len(weight.shape) >= 2:
            std = float(np.std(keras.ops.convert_to_numpy(weight))) or 0.02
            weight.assign(rng.normal(0.0, std, weight.shape).astype("float32"))
    return model


def _build(family, vocabulary_size, **transformer):
    config = {**TRANSFORMER, **transformer, "vocabulary_size": vocabulary_size}
    if family == "gpt":
        return models.GPTCausalLM(models.GPTBackbone(num_layers=2, **config))
    if family.startswith("bert"):
        backbone = models.BertBackbone(num_layers=2, **config)
        if family == "bert_classifier":
            return models.BertClassifier(backbone, num_classes=3, dropout=0.0)
        if family == "bert_tagger":
            return models.BertTokenClassifier(backbone, num_classes=5, dropout=0.0)
        return models.BertMaskedLM(backbone)
    if family == "seq2seq":
        return models.Seq2SeqTransformer(models.Seq2SeqBackbone(num_encoder_layers=2, num_decoder_layers=2, **config))
    if family == "rnn_lm":
        return models.RNNLanguageModel(vocabulary_size, embedding_dim=16, hidden_dim=16)
    if family == "feed_forward_lm":
        return models.FeedForwardLanguageModel(vocabulary_size, window_size=3, embedding_dim=8, hidden_dim=16)
    if family == "bilstm_classifier":
        return models.BiLSTMClassifier(vocabulary_size, num_classes=3, embedding_dim=16, hidden_dim=16)
    if family in FAMILIES:  # the shared causal-LM suite's tiny decoder of the family, at these sizes
        sizes = dict(vocab_size=vocabulary_size, max_position_embeddings=config["max_sequence_length"])
        return models.CausalLM(decoder_backbone(family, **sizes))
    raise ValueError(family)


def inputs(names, length, batch=2, seed=1, vocabulary_size=VOCABULARY_SIZE):
    """Random inputs for the model inputs `names`: ids in [1, V), the last row
    with its second half padded (where the model has a notion of padding)."""
    rng = np.random.default_rng(seed)
    real = np.ones((batch, length), np.int32)
    real[-1, max(1, length // 2) :] = 0
    arrays = {}
    for name in names:
        if name == "padding_mask":
            arrays[name] = real
        elif name == "segment_ids":
            arrays[name] = np.zeros((batch, length), np.int32)
        elif name == "mask_positions":
            arrays[name] = rng.integers(0, length, (batch, 3)).astype(np.int32)
        else:
            arrays[name] = rng.integers(1, vocabulary_size, (batch, length)).astype(np.int32) * real
    return arrays
