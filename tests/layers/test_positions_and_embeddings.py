import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from kzoo.layers import FeedForward
from kzoo.layers import PositionEmbedding
from kzoo.layers import RotaryEmbedding
from kzoo.layers import SinusoidalPositionEncoding
from kzoo.layers import TokenAndPositionEmbedding


def test_sinusoidal_encoding_is_the_papers_formula():
    x = np.zeros((2, 6, 8), "float32")
    got = ops.convert_to_numpy(SinusoidalPositionEncoding()(x, start_index=3))
    assert got.shape == (2, 6, 8)
    for pos in range(6):
        for i in range(4):
            angle = (pos + 3) / 10000 ** (2 * i / 8)
            np.testing.assert_allclose(got[1, pos, 2 * i], np.sin(angle), atol=1e-6)
            np.testing.assert_allclose(got[1, pos, 2 * i + 1], np.cos(angle), atol=1e-6)


def test_sinusoidal_encoding_matches_keras_hub():
    x = np.zeros((1, 20, 16), "float32")
    ours = SinusoidalPositionEncoding(max_wavelength=500)(x)
    theirs = keras_hub.layers.SinePositionEncoding(max_wavelength=500)(x)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_learned_position_embedding_slices_its_table():
    layer = PositionEmbedding(sequence_length=10)
    x = np.zeros((3, 4, 5), "float32")
    out = ops.convert_to_numpy(layer(x, start_index=2))
    table = ops.convert_to_numpy(layer.position_embeddings)
    np.testing.assert_array_equal(out[1], table[2:6])
    with pytest.raises(ValueError, match=r"must be <= `sequence_length` \(10\)"):
        layer(np.zeros((1, 11, 5), "float32"))
    with pytest.raises(ValueError, match=r"sequence_length"):
        layer(x, start_index=7)


def test_rotary_matches_keras_hub_and_depends_on_relative_position_only():
    x = np.random.default_rng(0).normal(size=(2, 7, 3, 8)).astype("float32")
    ours = ops.convert_to_numpy(RotaryEmbedding()(x, start_index=2))
    theirs = keras_hub.layers.RotaryEmbedding()(x, start_index=2)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)
    # q at position m and k at position n: the score depends on m - n only.
    q = np.tile(x[:1, :1, :1], (1, 7, 1, 1))
    k = np.tile(x[1:, :1, :1], (1, 7, 1, 1))
    rope = RotaryEmbedding()
    rq, rk = ops.convert_to_numpy(rope(q))[0, :, 0], ops.convert_to_numpy(rope(k))[0, :, 0]
    np.testing.assert_allclose(rq[5] @ rk[3], rq[3] @ rk[1], rtol=1e-4)
    with pytest.raises(ValueError, match="even"):
        rope(np.zeros((1, 2, 3), "float32"))


@pytest.mark.parametrize(
    "position, merge, width", [("learned", "add", 8), ("sinusoidal", "concat", 16), ("none", "add", 8)]
)
def test_token_and_position_embedding_merges(position, merge, width):
    layer = TokenAndPositionEmbedding(30, 12, 8, position=position, merge=merge, scale_embeddings=True)
    ids = np.array([[4, 9, 1]])
    out = ops.convert_to_numpy(layer(ids))
    assert out.shape == (1, 3, width)
    tokens = ops.convert_to_numpy(layer.embeddings)[ids[0]] * np.sqrt(8)
    positions = (
        np.zeros((3, 8))
        if position == "none"
        else ops.convert_to_numpy(layer.position_embedding(np.zeros((1, 3, 8), "float32")))[0]
    )
    want = tokens + positions if merge == "add" else np.concatenate([tokens, positions], -1)
    np.testing.assert_allclose(out[0], want, atol=1e-5)


def test_token_embedding_mask_and_length_checks():
    layer = TokenAndPositionEmbedding(30, 4, 8, mask_zero=True)
    ids = np.array([[4, 9, 0, 0]])
    np.testing.assert_array_equal(layer.compute_mask(ids), [[True, True, False, False]])
    with pytest.raises(ValueError, match=r"must be <= `sequence_length` \(4\)"):
        layer(np.ones((1, 5), "int32"))
    with pytest.raises(ValueError, match=r"position.*learned.*sinusoidal.*none"):
        TokenAndPositionEmbedding(30, 4, 8, position="rotary")
    with pytest.raises(ValueError, match=r"vocabulary_size.*positive"):
        TokenAndPositionEmbedding(0, 4, 8)


@pytest.mark.parametrize("bad_id", [30, -1])
def test_out_of_range_token_ids_fail_loudly(bad_id):
    layer = TokenAndPositionEmbedding(30, 8, 4)
    ids = np.array([[1, 2, bad_id]], "int32")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"token_ids` must be in \[0, 30\)"):
        layer(ids)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"token_ids` must be in \[0, 30\)"):
        tf.function(layer)(ids)
    # XLA drops assertions; the bad row must still not be a silent clamp.
    out = ops.convert_to_numpy(tf.function(layer, jit_compile=True)(ids))
    assert np.all(np.isnan(out[0, 2])) and np.all(np.isfinite(out[0, :2]))


def test_feed_forward_is_w2_act_w1():
    layer = FeedForward(12, activation="gelu_approximate")
    x = np.random.default_rng(1).normal(size=(2, 3, 5)).astype("float32")
    out = ops.convert_to_numpy(layer(x))
    w1, b1 = (ops.convert_to_numpy(w) for w in layer.intermediate_dense.weights)
    w2, b2 = (ops.convert_to_numpy(w) for w in layer.output_dense.weights)
    h = x @ w1 + b1
    h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
    np.testing.assert_allclose(out, h @ w2 + b2, atol=1e-5)
    with pytest.raises(ValueError, match=r"activation.*'swishy'"):
        FeedForward(4, activation="swishy")
    with pytest.raises(ValueError, match=r"intermediate_dim.*positive"):
        FeedForward(0)


def test_feed_forward_output_dim_and_shape():
    layer = FeedForward(12, output_dim=3, dropout=0.2)
    assert layer.compute_output_shape((None, 7, 5)) == (None, 7, 3)
    assert tuple(layer(keras.random.normal((2, 7, 5)), training=True).shape) == (2, 7, 3)
