"""`model.quantize("int8")` on every task model: close to float32 on real text, and it saves and reloads.

Keras' int8 quantization replaces the kernels of the Dense, EinsumDense and
Embedding layers with int8 ones and a scale per output (activations are
quantized per row at run time). kzoo's layers call those sublayers (never read
their kernels), so a quantized model computes what its float32 original does,
to int8 precision. Each tiny model trains briefly on the recipes' data
(tinyshakespeare characters, Amazon review sentiment), and on held-out data
the quantized model must stay within the stated bound of the float32 one.
"""

import gc
import json
import lzma
import os
import warnings

import keras
import numpy as np
import pytest

from kzoo import models
from kzoo.models import token_cross_entropy
from kzoo.tokenizers.word_piece import character_tokenizer
from kzoo.tokenizers.word_piece import train_word_piece_vocabulary
from kzoo.tokenizers.word_piece import word_piece_tokenizer
from tests.models import hf_folders
from tests.models.test_task_tokenizer import run_fresh

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "recipes", "data")
LENGTH = 32
BATCH = 16
TINY = dict(num_heads=2, hidden_dim=32, intermediate_dim=64, dropout=0.0)

# The quality bound: the held-out cross-entropy moves by at most 1% of its
# float32 value, and the top-1 prediction agrees on at least 97% of positions.
# (Measured: at most 0.11%, the tagger's, whose loss is near 0, and at least 99.05%, over the nine models.)
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
    # One block: what quantization replaces (attention, feed-forward, embeddings, the tied table) at
    # the cost of one block's trace of the train step, most of the test's time.
    transformer = dict(vocabulary_size=vocabulary, num_layers=1, max_sequence_length=LENGTH, **TINY)
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


def _logits(model, x):
    # A call, not `predict`: the float32, quantized and reloaded models would each trace a predict
    # function, for 256 rows that one call takes at once.
    return keras.ops.convert_to_numpy(model(x))


def _quality(model, x, y, w):
    logits = _logits(model, x)
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
    np.testing.assert_array_equal(_logits(reloaded, x_test), _logits(model, x_test))


# === Task models that carry their tokenizer (the recipes' models, Hugging Face folders) ===

# Reloads each quantized `.keras` file in a fresh process with `import kzoo` alone and gives, for the
# same strings, what the test computed in this process: the text outputs and the logits.
_RELOAD_AND_RUN = """
import json, sys
import keras
import numpy as np
import kzoo
out = {}
for name, texts in json.loads(sys.argv[2]).items():
    model = keras.saving.load_model(f"{sys.argv[1]}/{name}.keras")
    out[name] = [
        np.asarray(model.predict(texts, verbose=0)).tolist(),
        np.asarray(model.predict({k: v.numpy() for k, v in model.preprocess(texts).items()}, verbose=0)).tolist(),
        [layer.path for layer in model._flatten_layers() if layer.quantization_mode == "int8"],
    ]
print(json.dumps(out))
"""
TEXTS = ["a fine film", "ROMEO: But soft", "crème brûlée 😂"]


def _tokenizer_tasks(folder):
    """One task per tokenizer kind kzoo supports: the recipes' characters and WordPiece, and the
    WordPiece and byte-level BPE of Hugging Face folders (read with `from_preset`)."""
    keras.utils.set_random_seed(0)
    transformer = dict(num_layers=1, max_sequence_length=LENGTH, **TINY)
    vocabulary = train_word_piece_vocabulary(TEXTS * 4, 60)
    hf_folders.write_bert(folder / "bert", "BertForSequenceClassification", num_labels=2)
    hf_folders.write_gpt2(folder / "gpt2", "GPT2LMHeadModel")
    with warnings.catch_warnings():  # the tiny folders' untied or unused weights
        warnings.simplefilter("ignore")
        return {
            "characters": models.GPTCausalLM(
                models.GPTBackbone(vocabulary_size=256, **transformer), tokenizer=character_tokenizer(256)
            ),
            "word_piece": models.BertClassifier(
                models.BertBackbone(vocabulary_size=len(vocabulary), **transformer),
                num_classes=2,
                tokenizer=word_piece_tokenizer(vocabulary),
            ),
            "hf_word_piece": models.BertClassifier.from_preset(str(folder / "bert")),
            "hf_byte_pair": models.GPTCausalLM.from_preset(str(folder / "gpt2")),
        }


def test_int8_quantization_of_task_models_with_a_tokenizer_reloads_with_it_in_a_fresh_process(tmp_path):
    tasks = _tokenizer_tasks(tmp_path)
    expected = {}
    for name, model in tasks.items():
        float_inputs = {k: v.numpy() for k, v in model.preprocess(TEXTS).items()}
        float_logits = model.predict(float_inputs, verbose=0)
        assert not model.tokenizer.built  # never called, as in a loaded model: Keras cannot quantize it
        model.quantize("int8")
        assert model.tokenizer.quantization_mode is None
        np.testing.assert_array_equal(model.preprocess(TEXTS)["token_ids"], float_inputs["token_ids"])
        logits = model.predict({k: v.numpy() for k, v in model.preprocess(TEXTS).items()}, verbose=0)
        # Quantized, not replaced: the logits move, by little (int8 precision).
        assert 0 < np.abs(logits - float_logits).max() <= 0.05 * np.abs(float_logits).max(), name
        quantized = [layer.path for layer in model._flatten_layers() if layer.quantization_mode == "int8"]
        assert any("token_embedding" in path for path in quantized) and any("query" in path for path in quantized)
        expected[name] = [np.asarray(model.predict(TEXTS, verbose=0)).tolist(), logits.tolist(), quantized]
        model.save(tmp_path / f"{name}.keras")
    reloaded = run_fresh(_RELOAD_AND_RUN, tmp_path, json.dumps({name: TEXTS for name in tasks}))
    assert reloaded == expected


def test_quantize_warns_about_no_layer_it_leaves_as_it_is():
    # Keras warns for each layer without a `quantize` method: a decoder's norms and rotary positions.
    lm = models.CausalLM.from_preset("llama_tiny")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lm.quantize("int8")
    assert [str(w.message) for w in caught if "quantize" in str(w.message)] == []
    assert lm.backbone.transformer_blocks[0].self_attention.query_dense.quantization_mode == "int8"


def test_the_collections_keras_runs_per_kernel_walk_only_new_objects(monkeypatch):
    # Keras collects garbage for every kernel it replaces; kzoo freezes the objects that existed
    # before (a process holds half a million), and unfreezes and collects them once at the end.
    # A task and a backbone, in one test: each test's teardown walks every object of the process.
    # At each collection the test counts the objects it walks, the unfrozen ones (`gc.get_objects`):
    # `gc.get_freeze_count` walks the frozen ones, which made each count cost a collection's time.
    walked_at_each_collection = []
    collect = gc.collect
    monkeypatch.setattr(
        gc, "collect", lambda *args: walked_at_each_collection.append(len(gc.get_objects())) or collect(*args)
    )
    for model in ("task", "backbone"):
        lm = models.CausalLM.from_preset("llama_tiny")
        target = lm if model == "task" else lm.backbone
        walked_at_each_collection.clear()
        gc.unfreeze()  # as in a process that froze nothing (the suite freezes after each test)
        existing = len(gc.get_objects())
        target.quantize("int8")
        *per_kernel, last = walked_at_each_collection
        assert len(per_kernel) >= lm.backbone.num_layers * 4, model
        assert max(per_kernel) <= 0.1 * existing, model
        assert last >= 0.9 * existing and gc.get_freeze_count() == 0, model
    # A process that froze objects itself keeps them frozen.
    gc.freeze()
    frozen = gc.get_freeze_count()
    models.CausalLM.from_preset("llama_tiny").quantize("int8")
    assert gc.get_freeze_count() >= 0.9 * frozen  # less the frozen objects freed meanwhile
