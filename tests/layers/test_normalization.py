import keras
import numpy as np
import pytest
import tensorflow as tf

from kzoo import layers


def _random(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def _keras_norm(x, **kwargs):
    norm = keras.layers.LayerNormalization(**kwargs)
    norm.build(x.shape)
    norm.set_weights([_random(*w.shape, seed=5 + i) + 1 for i, w in enumerate(norm.weights)])
    return norm


@pytest.mark.parametrize("settings", [{}, {"center": False}, {"axis": 1}])
def test_layer_normalization_is_keras_in_inference_and_training(settings):
    x = _random(2, 5, 8) * 3 + 1
    theirs = _keras_norm(x, epsilon=1e-3, **settings)
    ours = layers.LayerNormalization(epsilon=1e-3, **settings)
    ours.build(x.shape)
    ours.set_weights(theirs.get_weights())
    np.testing.assert_allclose(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
    trained = tf.function(lambda: ours(tf.constant(x), training=True))()  # fused where the settings allow
    np.testing.assert_allclose(trained, theirs(x), rtol=1e-5, atol=1e-5)


def test_add_and_norm_normalizes_the_sum_and_drops_the_sublayer_output_in_training():
    x, y = _random(4, 64, 8), _random(4, 64, 8, seed=1)
    theirs = _keras_norm(x, epsilon=1e-5)
    for rate in (0.0, 0.5):
        ours = layers.AddAndNorm(rate, epsilon=1e-5, seed=3)
        ours.build(x.shape)
        ours.set_weights(theirs.get_weights())
        np.testing.assert_allclose(ours(x, y), theirs(x + y), rtol=1e-5, atol=1e-5)
        step = tf.function(lambda: ours(tf.constant(x), tf.constant(y), training=True))
        trained, again = step().numpy(), step().numpy()
        if rate == 0:
            np.testing.assert_allclose(trained, theirs(x + y), rtol=1e-5, atol=1e-5)
        else:  # each row sums x with some of 2 y: neither x + y nor the same twice
            assert not np.allclose(trained, theirs(x + y), atol=1e-3) and not np.allclose(trained, again, atol=1e-3)


def test_add_and_norm_refuses_settings_its_op_does_not_compute():
    with pytest.raises(ValueError, match="center=False"):
        layers.AddAndNorm(0.1, center=False)


def test_layer_normalization_refuses_keras_rms_scaling_which_is_not_rms_norm():
    with pytest.raises(ValueError, match="RMSNormalization"):
        layers.LayerNormalization(rms_scaling=True)
