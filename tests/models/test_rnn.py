"""The RNN baselines: LSTM/GRU/RNN language model, BiLSTM tagger and classifier."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from kzoo import models
from tests.models.fresh_process import assert_reload_in_fresh_process
from tests.models.model_checks import dense
from tests.models.model_checks import pad
from tests.models.model_checks import repeated

VOCABULARY_SIZE = 30
NUM_LABELS = 5
LENGTHS = (10, 8, 6, 3)
CONFIG = dict(vocabulary_size=VOCABULARY_SIZE, embedding_dim=16, hidden_dim=24, num_layers=2, dropout=0.0)
MODELS = ("lstm_lm", "gru_lm", "rnn_lm", "tagger", "classifier")
# Tracing a train step dominates the test time (a trace per recurrent layer
# and direction), so the training tests use one layer; the others use CONFIG.
ONE_LAYER = dict(num_layers=1)


def build(name, **overrides):
    if name.endswith("_lm"):
        cls, required = models.RNNLanguageModel, {"cell": name[: -len("_lm")]}
    elif name == "tagger":
        cls, required = models.BiLSTMTagger, {"num_labels": NUM_LABELS}
    else:
        cls, required = models.BiLSTMClassifier, {"num_classes": NUM_LABELS}
    return cls(**{**CONFIG, **required, **overrides})


def padded_ids(seed=0, lengths=LENGTHS, length=max(LENGTHS)):
    """Random ids in [1, V), right-padded with 0 after `lengths[i]` tokens."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCABULARY_SIZE, (len(lengths), length)).astype("int32")
    return ids * (np.arange(length)[None, :] < np.asarray(lengths)[:, None])


def batch(name, seed=0, **overrides):
    """A model and a padded batch `(model, x, y)`; padded positions of `y` are
    left with arbitrary values, which the padding mask must hide."""
    model = build(name, **overrides)
    rng = np.random.default_rng(seed)
    if name.endswith("_lm"):
        ids = padded_ids(seed, lengths=[length + 1 for length in LENGTHS], length=max(LENGTHS) + 1)
        return model, ids[:, :-1], ids[:, 1:]
    x = padded_ids(seed)
    if name == "tagger":
        return model, x, rng.integers(0, NUM_LABELS, x.shape).astype("int32")
    return model, x, np.arange(len(LENGTHS), dtype="int32") % NUM_LABELS


def loss_of(model, x, y):
    # The logits carry the padding mask; the Keras loss applies it.
    return float(keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, model(x)))


# --- Training ---


# The GRU and Elman cells share the LSTM's code path; gradients, masking and
# saving are checked for them below.
@pytest.mark.parametrize("name", ["lstm_lm", "tagger", "classifier"])
def test_overfits_a_tiny_batch(name):
    model, x, y = batch(name, **ONE_LAYER)
    model.compile(learning_rate=1e-2, warmup_steps=5)
    before = loss_of(model, x, y)
    model.fit(repeated(x), repeated(y), batch_size=len(LENGTHS), shuffle=False, verbose=0)
    after = loss_of(model, x, y)
    assert after <= 0.1 * before, (before, after)


@pytest.mark.parametrize("name", MODELS)
def test_gradients_reach_every_trainable_variable(name):
    model, x, y = batch(name)
    with tf.GradientTape() as tape:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, model(x, training=True))
    variables = model.trainable_variables
    for variable, gradient in zip(variables, tape.gradient(loss, variables)):
        assert gradient is not None, variable.path
        assert np.any(dense(gradient) != 0), variable.path


def test_padding_is_left_out_of_the_loss_and_metrics():
    model, x, y = batch("lstm_lm")
    model.compile()
    garbage = np.where(x == 0, 7, y)  # other targets at the padded positions
    results = [model.evaluate(x, targets, verbose=0, return_dict=True) for targets in (y, garbage)]
    for key in ("loss", "accuracy", "perplexity"):
        assert results[0][key] == pytest.approx(results[1][key], rel=1e-6), key
    # Perplexity and the loss average over the same (real) tokens.
    assert results[0]["perplexity"] == pytest.approx(np.exp(results[0]["loss"]), rel=1e-5)


# Each model under one policy, each policy with a sequence and a pooled output. One eager step:
# tracing a train function per model would be most of the test's time; training in graph mode is
# tested above (and a mixed precision step in graph mode, loss scaling included, in
# test_feed_forward_lm.py).
@pytest.mark.parametrize(
    "name, policy", [("lstm_lm", "mixed_float16"), ("tagger", "mixed_bfloat16"), ("classifier", "mixed_float16")]
)
def test_mixed_precision_forward_and_fit_step(name, policy):
    keras.config.set_dtype_policy(policy)
    model, x, y = batch(name, **ONE_LAYER)
    logits = model(x)
    assert logits.dtype == "float32"
    assert np.all(np.isfinite(np.asarray(logits)))
    model.compile(run_eagerly=True)
    if policy == "mixed_float16":
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    loss = model.train_on_batch(x, y, return_dict=True)["loss"]
    assert np.isfinite(loss)
    assert all(np.all(np.isfinite(np.asarray(variable))) for variable in model.trainable_variables)


def test_explicit_dtype_policy_without_a_global_one():
    model = build("tagger", dtype="mixed_float16")
    assert model.get_layer("bidirectional_lstm_0").compute_dtype == "float16"
    assert model(padded_ids()).dtype == "float32"
    model.compile()
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)


# --- Masking ---


@pytest.mark.parametrize("name", MODELS)
def test_outputs_of_real_tokens_do_not_depend_on_padding(name):
    model, x, _ = batch(name)
    reference = ops.convert_to_numpy(model(x))
    padded = ops.convert_to_numpy(model(pad(x, 6)))
    if name == "classifier":
        np.testing.assert_allclose(padded, reference, atol=1e-5)
        return
    real = x != 0
    np.testing.assert_allclose(padded[:, : x.shape[1]][real], reference[real], atol=1e-5)


def test_bidirectional_states_see_both_sides():
    # A tagger's output at t depends on tokens before and after t.
    model, x, _ = batch("tagger")
    reference = ops.convert_to_numpy(model(x))
    for changed_position, other_side in ((0, slice(1, 3)), (2, slice(0, 2))):
        changed = x.copy()
        changed[:, changed_position] = changed[:, changed_position] % (VOCABULARY_SIZE - 1) + 1
        logits = ops.convert_to_numpy(model(changed))
        assert not np.allclose(logits[:, other_side], reference[:, other_side], atol=1e-4)


def test_language_model_output_at_t_does_not_depend_on_later_tokens():
    model, x, _ = batch("lstm_lm")
    x = np.where(x == 0, 5, x)
    reference = ops.convert_to_numpy(model(x))
    for t in range(x.shape[1] - 1):
        changed = x.copy()
        changed[:, t + 1 :] = np.random.default_rng(t).integers(1, VOCABULARY_SIZE, changed[:, t + 1 :].shape)
        logits = ops.convert_to_numpy(model(changed))
        np.testing.assert_allclose(logits[:, : t + 1], reference[:, : t + 1], atol=1e-6)


# --- Saving ---


def test_keras_round_trip_in_a_fresh_process(tmp_path):
    saved = {}
    for name in ("lstm_lm", "gru_lm", "tagger", "classifier"):
        model, x, _ = batch(name)
        model.compile()
        saved[name] = (model, x)
    assert_reload_in_fresh_process(tmp_path, saved)


def test_config_round_trip():
    for name in MODELS:
        model = build(name, dropout=0.25)
        clone = type(model).from_config(model.get_config())
        assert clone.get_config() == model.get_config(), name
        assert clone.count_params() == model.count_params(), name


def test_parameter_count_of_a_two_layer_lstm_language_model():
    # Embedding V x E; each LSTM layer 4 gates x (inputs x H + H x H + H);
    # softmax layer H x V + V.
    expected = 30 * 16 + 4 * (16 * 24 + 24 * 24 + 24) + 4 * (24 * 24 + 24 * 24 + 24) + 24 * 30 + 30
    assert build("lstm_lm").count_params() == expected


# --- Validation ---


BAD_CONFIGS = [
    ("lstm_lm", {"cell": "transformer"}, "cell"),
    ("lstm_lm", {"vocabulary_size": 0}, "vocabulary_size"),
    ("lstm_lm", {"embedding_dim": 2.5}, "embedding_dim"),
    ("gru_lm", {"hidden_dim": -1}, "hidden_dim"),
    ("rnn_lm", {"num_layers": 0}, "num_layers"),
    ("tagger", {"dropout": 1.5}, "dropout"),
    ("tagger", {"num_labels": 0}, "num_labels"),
    ("classifier", {"num_classes": None}, "num_classes"),
]


# One test for all cases: each test's Keras teardown costs about a second.
def test_bad_config_raises_naming_the_argument():
    for name, overrides, argument in BAD_CONFIGS:
        with pytest.raises(ValueError, match=f"`{argument}`"):
            build(name, **overrides)
