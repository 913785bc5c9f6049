"""`model.quantize("int8")` on every task model: close to float32 on real text, and it saves and reloads.

Keras' int8 quantization replaces the kernels of the Dense, EinsumDense and
Embedding layers with int8 ones and a scale per output (activations are
quantized per row at run time). kzoo's layers call those sublayers (never read
their kernels), so a quantized model computes what its float32 original does,
to int8 precision. Each tiny model trains briefly on the recipes' data
(tinyshakespeare characters, Amazon review sentiment), and on held-out data
the quantized model must stay within the stated bound of the float32 one.
"""

import lzma
import os

import keras
import numpy as np
import pytest

from kzoo import models
from kzoo.models import token_cross_entropy

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "recipes", "data")
LENGTH = 32
BATCH = 16
TINY = dict(num_heads=2, hidden_dim=32, intermediate_dim=64, dropout=0.0)

# The quality bound: the held-out cross-entropy moves by at most 1% of its
# float32 value, and the top-1 prediction agrees on at least 97% of positions.
# (Measured: at most 0.01% and at least 99.05%, over the nine models.)
LOSS_CHANGE = 0.01
AGREEMENT = 0.97


def _characters():
    with lzma.open(os.path.join(DATA, "tinyshakespeare", "input.txt.xz"), "rt") as f:
        text = f.read(60_000)
    alphabet = sorted(set(text))  # ids 1.., 0 is padding and the last id [MASK]
    return np.array([alphabet.index(c) + 1 for c in text], "int32"), alphabet


def _reviews():
    with lzma.open(os.path.join(DATA, "sentiment-labelled-sentences", "amazon_cells_labelled.txt.xz"), "rt") as f:
        rows = [line.rstrip("\n").rsplit("\t", 1) for line in f if "\t" in line]
    ids = np.zeros((len(rows), LENGTH), "int32")
    for i, (sentence, _) in enumerate(rows):
        codes = [min(ord(c), 127) for c in sentence.lower()[:LENGTH]]
        ids[i, : len(codes)] = codes
    return ids, np.array([int(label) for _, label in rows], "int32")


def _case(name):
    """`(model, x_train, y_train, w_train, x_test, y_test, w_test)` for one task model."""
    rng = np.random.default_rng(0)
    chars, alphabet = _characters()
    vocabulary = len(alphabet) + 2
    windows = np.stack([chars[i : i + LENGTH + 1] for i in range(0, len(chars) - LENGTH - 1, LENGTH // 2)])
    ids, targets = windows[:, :-1], windows[:, 1:]
    ones = np.ones_like(ids)
    transformer = dict(vocabulary_size=vocabulary, num_layers=2, max_sequence_length=LENGTH, **TINY)
    recurrent = dict(vocabulary_size=vocabulary, embedding_dim=16, hidden_dim=32)
    if name == "GPTCausalLM":
        model = models.GPTCausalLM(models.GPTBackbone(**transformer))
        data = ({"token_ids": ids, "padding_mask": ones}, targets, ones)
    elif name == "RNNLanguageModel":
        data = (ids, targets, ones)
        model = models.RNNLanguageModel(**recurrent)
    elif name == "FeedForwardLanguageModel":
        data = (ids, targets, ones)
        model = models.FeedForwardLanguageModel(window_size=4, **recurrent)
    elif name == "Seq2SeqTransformer":  # copy the text one step late
        backbone = models.Seq2SeqBackbone(
            vocabulary_size=vocabulary, num_encoder_layers=1, num_decoder_layers=1, max_sequence_length=LENGTH, **TINY
        )
        model = models.Seq2SeqTransformer(backbone)
        data = ({"encoder_token_ids": targets, "decoder_token_ids": ids}, targets, ones)
    elif name == "BertMaskedLM":
        positions = np.sort(np.stack([rng.choice(LENGTH, 5, replace=False) for _ in ids]), -1).astype("int32")
        masked = ids.copy()
        np.put_along_axis(masked, positions, vocabulary - 1, -1)
        model = models.BertMaskedLM(models.BertBackbone(**transformer))
        x = {"token_ids": masked, "segment_ids": 0 * ids, "padding_mask": ones, "mask_positions": positions}
        data = (x, np.take_along_axis(ids, positions, -1), np.ones_like(positions))
    elif name in ("BertTokenClassifier", "BiLSTMTagger"):  # tag each character: letter, space, punctuation
        letters = np.array([0] + [c.isalpha() for c in alphabet] + [0])
        spaces = np.array([0] + [c.isspace() for c in alphabet] + [0])
        tags = np.where(letters[ids], 0, np.where(spaces[ids], 1, 2)).astype("int32")
        if name == "BiLSTMTagger":
            model = models.BiLSTMTagger(num_labels=3, **recurrent)
            data = (ids, tags, ones)
        else:
            model = models.BertTokenClassifier(models.BertBackbone(**transformer), num_classes=3, dropout=0.0)
            data = ({"token_ids": ids, "segment_ids": 0 * ids, "padding_mask": ones}, tags, ones)
    else:  # review sentiment
        ids, labels = _reviews()
        weights = np.ones_like(labels)
        if name == "BiLSTMClassifier":
            model = models.BiLSTMClassifier(vocabulary_size=128, num_classes=2, embedding_dim=16, hidden_dim=32)
            data = (np.maximum(ids, 0), labels, weights)
        else:
            backbone = models.BertBackbone(**{**transformer, "vocabulary_size": 128})
            model = models.BertClassifier(backbone, num_classes=2, dropout=0.0)
            x = {"token_ids": ids, "segment_ids": 0 * ids, "padding_mask": (ids > 0).astype("int32")}
            data = (x, labels, weights)
    split = int(0.8 * len(data[1]))
    train = keras.tree.map_structure(lambda a: a[:split], data)
    test = keras.tree.map_structure(lambda a: a[split:][:256], data)
    return model, train, test


# By default a transformer (attention, feed-forward, embeddings and the tied table, the layers every
# transformer task shares) and a recurrent model; KZOO_SLOW=1 runs every task model.
DEFAULT_TASKS = ["GPTCausalLM", "BiLSTMTagger"]
TASKS = [
    name if name in DEFAULT_TASKS else pytest.param(name, marks=pytest.mark.slow)
    for name in [
        "GPTCausalLM",
        "BertMaskedLM",
        "BertClassifier",
        "BertTokenClassifier",
        "Seq2SeqTransformer",
        "RNNLanguageModel",
        "FeedForwardLanguageModel",
        "BiLSTMClassifier",
        "BiLSTMTagger",
    ]
]


def _quality(model, x, y, w):
    logits = keras.ops.convert_to_numpy(model.predict(x, batch_size=64, verbose=0))
    losses = keras.ops.convert_to_numpy(token_cross_entropy(y, logits))
    return float((losses * w).sum() / w.sum()), logits.argmax(-1)


@pytest.mark.parametrize("name", TASKS)
def test_int8_quantization_stays_close_to_float32_and_reloads(name, tmp_path):
    model, (x, y, w), (x_test, y_test, w_test) = _case(name)
    model.compile(learning_rate=3e-3)
    steps = min(120, len(y) // BATCH)  # about 120 steps: several passes over the 800 training reviews
    model.fit(x, y, sample_weight=w, batch_size=BATCH, epochs=120 // steps, steps_per_epoch=steps, verbose=0)
    loss, predictions = _quality(model, x_test, y_test, w_test)
    model.quantize("int8")
    quantized_loss, quantized_predictions = _quality(model, x_test, y_test, w_test)
    assert abs(quantized_loss - loss) <= LOSS_CHANGE * loss, (loss, quantized_loss)
    assert (quantized_predictions == predictions).mean() >= AGREEMENT
    model.save(tmp_path / "quantized.keras")
    reloaded = keras.saving.load_model(tmp_path / "quantized.keras")
    assert any(layer.quantization_mode == "int8" for layer in reloaded._flatten_layers())
    np.testing.assert_array_equal(
        reloaded.predict(x_test, batch_size=64, verbose=0), model.predict(x_test, batch_size=64, verbose=0)
    )
