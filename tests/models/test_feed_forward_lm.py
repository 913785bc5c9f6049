"""The feed-forward window language model (Bengio et al., 2003)."""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from keras import ops

from kzoo import models
from tests.models.fresh_process import REPOSITORY
from tests.models.fresh_process import assert_reload_in_fresh_process
from tests.models.model_checks import dense
from tests.models.model_checks import repeated

VOCABULARY_SIZE = 30
CONFIG = dict(vocabulary_size=VOCABULARY_SIZE, window_size=3, embedding_dim=8, hidden_dim=16, num_layers=2)


def build(**overrides):
    return models.FeedForwardLanguageModel(**{**CONFIG, **overrides})


def token_ids(shape, seed=0):
    """Random real ids, in [1, V)."""
    return np.random.default_rng(seed).integers(1, VOCABULARY_SIZE, shape).astype("int32")


def logits_of(model, ids):
    return ops.convert_to_numpy(model(ids))


# --- The window ---


@settings(max_examples=15, deadline=None)
@given(window_size=st.integers(1, 5), length=st.integers(1, 10), data=st.data())
def test_logits_at_t_depend_on_exactly_the_tokens_t_minus_n_plus_1_to_t(window_size, length, data):
    changed_position = data.draw(st.integers(0, length - 1), label="changed_position")
    model = build(window_size=window_size, num_layers=1)
    ids = token_ids((1, length), seed=length)
    changed = ids.copy()
    changed[0, changed_position] = ids[0, changed_position] % (VOCABULARY_SIZE - 1) + 1  # another real id
    difference = np.abs(logits_of(model, changed) - logits_of(model, ids)).max(axis=-1)[0]  # (T,)
    for t in range(length):
        if t - window_size < changed_position <= t:
            assert difference[t] > 1e-6, (t, changed_position)
        else:
            assert difference[t] == 0.0, (t, changed_position)


def test_left_padding_changes_nothing_and_right_padding_is_masked():
    model = build()
    ids = token_ids((2, 6))
    reference = logits_of(model, ids)
    left_padded = np.pad(ids, ((0, 0), (4, 0)))
    np.testing.assert_allclose(logits_of(model, left_padded)[:, 4:], reference, atol=1e-6)

    right_padded = np.pad(ids, ((0, 0), (0, 3)))
    logits = model(right_padded)
    np.testing.assert_allclose(ops.convert_to_numpy(logits)[:, :6], reference, atol=1e-6)
    # The logits carry the padding mask, which Keras losses and metrics apply.
    np.testing.assert_array_equal(ops.convert_to_numpy(logits._keras_mask), right_padded != 0)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_matches_a_numpy_reference(activation):
    window_size, embedding_dim = 3, 4
    model = build(window_size=window_size, embedding_dim=embedding_dim, activation=activation)
    rng = np.random.default_rng(0)
    for weight in model.weights:
        weight.assign(rng.normal(0.0, 0.5, weight.shape).astype("float32"))
    ids = np.array([[5, 1, 29, 7, 3], [2, 9, 4, 0, 0]], "int32")

    act = np.tanh if activation == "tanh" else lambda x: np.maximum(x, 0.0)
    table = ops.convert_to_numpy(model.get_layer("token_embedding").embeddings)
    vectors = np.where((ids != 0)[..., None], table[ids], 0.0)  # padding reads as zeros
    vectors = np.pad(vectors, ((0, 0), (window_size - 1, 0), (0, 0)))  # so are slots before the start
    h = np.concatenate([vectors[:, k : k + ids.shape[1]] for k in range(window_size)], axis=-1)  # oldest first
    for name in ("hidden_0", "hidden_1"):
        kernel, bias = model.get_layer(name).get_weights()
        h = act(h @ kernel + bias)
    kernel, bias = model.get_layer("logits").get_weights()
    np.testing.assert_allclose(logits_of(model, ids), h @ kernel + bias, rtol=1e-5, atol=1e-5)


def test_window_of_one_is_a_bigram_model():
    # Each position sees its own token only: equal tokens give equal logits wherever they stand.
    logits = logits_of(build(window_size=1), np.array([[4, 9, 4, 4, 9]], "int32"))[0]
    np.testing.assert_array_equal(logits[0], logits[2])
    np.testing.assert_array_equal(logits[1], logits[4])


# --- Training ---


def test_overfits_a_tiny_batch_and_leaves_padding_out():
    model = build(num_layers=1)
    ids = token_ids((4, 9), seed=3)
    ids[-1, 6:] = 0  # a shorter row
    x, y = ids[:, :-1], ids[:, 1:]
    model.compile(learning_rate=1e-2, warmup_steps=5)
    before = model.evaluate(x, y, verbose=0, return_dict=True)
    model.fit(repeated(x), repeated(y), batch_size=len(x), shuffle=False, verbose=0)
    after = model.evaluate(x, y, verbose=0, return_dict=True)
    assert after["loss"] <= 0.1 * before["loss"], (before, after)
    # Other targets where the inputs are padding change nothing.
    garbage = np.where(x == 0, 7, y)
    moved = model.evaluate(x, garbage, verbose=0, return_dict=True)
    for key in ("loss", "accuracy", "perplexity"):
        assert moved[key] == pytest.approx(after[key], rel=1e-6), key
    assert after["perplexity"] == pytest.approx(np.exp(after["loss"]), rel=1e-5)


def test_gradients_reach_every_trainable_variable():
    model = build(dropout=0.1)
    x, y = token_ids((2, 7)), token_ids((2, 7), seed=1)
    with tf.GradientTape() as tape:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, model(x, training=True))
    for variable, gradient in zip(model.trainable_variables, tape.gradient(loss, model.trainable_variables)):
        assert gradient is not None and np.any(dense(gradient) != 0), variable.path


# A train step in graph mode, as `fit` runs it: the other models' mixed precision tests take theirs
# eagerly, so this one keeps loss scaling's graph path (a conditional update) tested.
def test_mixed_precision_gives_float32_logits_and_finite_steps():
    model = build(dtype="mixed_float16")
    assert model.get_layer("hidden_0").compute_dtype == "float16"
    x, y = token_ids((2, 7)), token_ids((2, 7), seed=1)
    assert model(x).dtype == "float32"
    model.compile()
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert np.isfinite(model.train_on_batch(x, y, return_dict=True)["loss"])


# --- Saving and backends ---


def test_keras_round_trip_in_a_fresh_process(tmp_path):
    model = build(activation="gelu_approximate", dropout=0.25)
    model.compile()
    x = token_ids((2, 7))
    x[1, 5:] = 0
    assert_reload_in_fresh_process(tmp_path, {"feed_forward_lm": (model, x)})


def test_config_round_trip_and_parameter_count():
    model = build(dropout=0.25, activation="relu")
    clone = type(model).from_config(model.get_config())
    assert clone.get_config() == model.get_config()
    # Embedding V x d; hidden layers (n d) x h + h and h x h + h; softmax layer h x V + V.
    expected = 30 * 8 + (3 * 8 * 16 + 16) + (16 * 16 + 16) + (16 * 30 + 30)
    assert model.count_params() == clone.count_params() == expected


def test_saved_under_tensorflow_gives_the_same_logits_under_jax(tmp_path):
    pytest.importorskip("jax")
    model = build()
    ids = token_ids((2, 7))
    ids[1, 4:] = 0
    model.save(tmp_path / "model.keras")
    np.save(tmp_path / "ids.npy", ids)
    script = textwrap.dedent(
        """
        import sys, jax, keras, numpy as np
        import kzoo
        assert keras.backend.backend() == "jax"
        model = keras.saving.load_model(sys.argv[1] + "/model.keras")
        ids = np.load(sys.argv[1] + "/ids.npy")
        np.save(sys.argv[1] + "/jax_logits.npy", np.asarray(jax.jit(model)(ids)))
        """
    )
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "2"}
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, cwd=REPOSITORY, env=env, timeout=300)
    np.testing.assert_allclose(np.load(tmp_path / "jax_logits.npy"), logits_of(model, ids), atol=1e-5)


# --- Validation ---


BAD_CONFIGS = [
    ({"window_size": 0}, "window_size", "positive integer"),
    ({"window_size": 2.0}, "window_size", "positive integer"),
    ({"vocabulary_size": 0}, "vocabulary_size", "positive integer"),
    ({"embedding_dim": None}, "embedding_dim", "positive integer"),
    ({"hidden_dim": -1}, "hidden_dim", "positive integer"),
    ({"num_layers": 0}, "num_layers", "positive integer"),
    ({"dropout": 1.0}, "dropout", "in \\[0, 1\\)"),
    ({"activation": "tanhh"}, "activation", "Keras activation name"),
]


# One test for all cases: each test's Keras teardown costs about a second.
def test_bad_config_raises_naming_the_argument_and_its_range():
    for overrides, argument, allowed in BAD_CONFIGS:
        with pytest.raises(ValueError, match=f"`{argument}` .*{allowed}.*received {argument}="):
            build(**overrides)
