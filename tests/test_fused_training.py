"""The fused training path: `kzoo.ops.fused`, drawn-noise dropout and the token cross-entropy.

In training, kzoo's layers run their element-wise chains through `kzoo.ops.fused`
(one XLA computation each under TensorFlow, in graphs only). These tests hold that
path to the plain one: same values and gradients where dropout is off, the dropout
rule itself on hand-made noise, and the loss against Keras' own.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

import kzoo
from kzoo.ops import dropout
from kzoo.ops import dropout_noise
from kzoo.ops import fused


def random(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def test_fused_equals_the_plain_function_in_values_and_gradients():
    def fn(x, bias, scale):
        return ops.sigmoid(x + bias) * scale

    x, bias = tf.constant(random(3, 5)), tf.constant(random(5, seed=1))

    def value_and_grads(call):
        with tf.GradientTape() as tape:
            tape.watch([x, bias])
            y = call(x, bias)
            loss = ops.sum(y * ops.arange(5, dtype="float32"))
        return [y, *tape.gradient(loss, [x, bias])]

    plain = value_and_grads(lambda a, b: fn(a, b, scale=2.0))
    in_graph = tf.function(lambda: value_and_grads(lambda a, b: fused(fn, a, b, scale=2.0)))()
    for got, want in zip(in_graph, plain):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_fused_accepts_variables_and_missing_arguments():
    variable = keras.Variable(np.ones(3, "float32"))
    graph = tf.function(lambda: fused(lambda v, none: v * 2 if none is None else v, variable, None))
    np.testing.assert_array_equal(graph(), [2.0, 2.0, 2.0])


def test_dropout_keeps_where_the_16_bit_number_reaches_the_rate_and_rescales():
    # The numbers 6553, 6554, 0, 65535 packed low half first; rate 0.1 keeps >= 6554 (0.1 * 65536, rounded).
    bits = ops.array([6553 | 6554 << 16, 0 | 65535 << 16], "int64")
    bits = ops.cast(ops.where(bits >= 2**31, bits - 2**32, bits), "int32")
    np.testing.assert_allclose(dropout(ops.ones((4,)), bits, 0.1), [0.0, 1 / 0.9, 0.0, 1 / 0.9], rtol=1e-6)
    # An odd last axis uses the first of the last pair.
    np.testing.assert_allclose(dropout(ops.ones((3,)), bits, 0.1), [0.0, 1 / 0.9, 0.0], rtol=1e-6)
    x = ops.ones((2,))
    assert dropout(x, None, 0.0) is x
    assert dropout_noise((2, 3), 0.0, seed=None) is None


def test_dropout_noise_drops_at_the_rate_and_is_seeded():
    noise = dropout_noise((1000, 201), 0.1, seed=7)
    assert tuple(noise.shape) == (1000, 101) and noise.dtype == "int32"
    dropped = ops.convert_to_numpy(dropout(ops.ones((1000, 201)), noise, 0.1)) == 0
    assert abs(dropped.mean() - 0.1) < 0.003
    # Both halves of the bits are used, each at the rate.
    assert abs(dropped[:, 0::2].mean() - 0.1) < 0.004 and abs(dropped[:, 1::2].mean() - 0.1) < 0.004
    np.testing.assert_array_equal(noise, dropout_noise((1000, 201), 0.1, seed=7))


def test_noise_from_a_seed_generator_spans_int32_drops_at_the_rate_and_differs_per_call():
    # The layers' path under TensorFlow: full-range draws, a new draw per call.
    seed = keras.random.SeedGenerator(3)
    draw = tf.function(lambda: dropout_noise((1000, 201), 0.1, seed))
    noise, again = draw(), draw()
    assert tuple(noise.shape) == (1000, 101) and noise.dtype == "int32"
    bits = ops.convert_to_numpy(noise)
    assert bits.min() < -(2**31) + 2**22 and bits.max() > 2**31 - 2**22
    dropped = ops.convert_to_numpy(dropout(ops.ones((1000, 201)), noise, 0.1)) == 0
    assert abs(dropped[:, 0::2].mean() - 0.1) < 0.004 and abs(dropped[:, 1::2].mean() - 0.1) < 0.004
    assert not np.array_equal(bits, ops.convert_to_numpy(again))


def test_bert_embedding_norm_is_the_sum_normalized_then_dropped():
    from kzoo.models.bert.bert_backbone import LayerNormalization

    a, b = tf.constant(random(4, 64, 32)), tf.constant(random(4, 64, 32, seed=1))
    norm = LayerNormalization(0.5, epsilon=1e-12)
    plain = keras.layers.LayerNormalization(epsilon=1e-12)(a + b)
    np.testing.assert_allclose(norm([a, b]), plain, rtol=1e-5, atol=1e-5)
    trained = ops.convert_to_numpy(tf.function(lambda: norm([a, b], training=True))())
    kept = trained != 0
    np.testing.assert_allclose(trained[kept], 2 * ops.convert_to_numpy(plain)[kept], rtol=1e-5, atol=1e-5)
    assert abs(kept.mean() - 0.5) < 0.02
    assert LayerNormalization.from_config(norm.get_config()).dropout == 0.5


def test_bert_weights_keep_the_keras_layer_norm_path(tmp_path):
    # Files saved when the embedding LayerNorm was `keras.layers.LayerNormalization` still load.
    import zipfile

    import h5py

    backbone = kzoo.models.BertBackbone(vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16)
    backbone.save(tmp_path / "bert.keras")
    with zipfile.ZipFile(tmp_path / "bert.keras") as archive, archive.open("model.weights.h5") as weights:
        assert list(h5py.File(weights)["layers/layer_normalization/vars"]) == ["0", "1"]


def test_inside_whole_model_xla_the_noise_is_uniform_floats():
    seed = keras.random.SeedGenerator(1)
    noise = tf.function(lambda: dropout_noise((4, 5), 0.1, seed), jit_compile=True)()
    assert tuple(noise.shape) == (4, 5) and noise.dtype == "float32"
    np.testing.assert_allclose(dropout(ops.ones((3,)), ops.array([0.05, 0.1, 0.9]), 0.1), [0.0, 1 / 0.9, 1 / 0.9], rtol=1e-6)


def test_fused_attention_drops_the_inference_weights_and_zeros_key_less_rows():
    query, key = tf.constant(random(2, 3, 4, 8)), tf.constant(random(2, 3, 6, 8, seed=1))
    value = tf.eye(6, batch_shape=(2, 3))  # the output is the (dropped) weights themselves
    mask = np.ones((2, 1, 4, 6), bool)
    mask[0, :, 1] = False  # query 1 of example 0 has no key
    mask[1, :, :, 4:] = False
    attention = kzoo.layers.scaled_dot_product_attention
    _, want = attention(query, key, value, mask=mask, return_scores=True)
    dropped, weights = tf.function(
        lambda: attention(query, key, value, mask=mask, dropout_rate=0.5, training=True, return_scores=True, seed=3)
    )()
    np.testing.assert_allclose(weights, want, atol=1e-6)
    dropped, want = ops.convert_to_numpy(dropped), ops.convert_to_numpy(want)
    kept = dropped != 0
    np.testing.assert_allclose(dropped[kept], 2 * want[kept], rtol=1e-5)
    assert 0.35 < kept[want > 0].mean() < 0.65
    assert not dropped[0, :, 1].any() and not dropped[1, ..., 4:].any()


@pytest.mark.parametrize("norm_first", [False, True])
def test_a_block_trains_on_the_fused_path_as_it_infers_when_dropout_is_off(norm_first):
    """With dropout 0, a graph training call (fused) equals the eager inference call, gradients included."""
    block = kzoo.layers.TransformerDecoderBlock(2, 32, dropout=0.0, activation="gelu_approximate", norm_first=norm_first)
    x, encoded = tf.constant(random(2, 6, 16)), tf.constant(random(2, 3, 16, seed=1))
    masks = dict(padding_mask=np.array([[1, 1, 1, 1, 0, 0], [1] * 6], bool), encoder_padding_mask=np.array([[1, 1, 0], [1, 1, 1]], bool))
    block(x, encoded, **masks)

    def value_and_grads(training):
        with tf.GradientTape() as tape:
            y = block(x, encoded, **masks, training=training)
            loss = ops.sum(ops.square(y))
        return [y, *tape.gradient(loss, block.trainable_weights)]

    want = value_and_grads(False)
    got = tf.function(lambda: value_and_grads(True))()
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_training_dropout_drops_at_the_rate_and_differs_per_call():
    # Every hidden unit is relu(0 x + 1) = 1; the identity output kernel copies them out.
    layer = kzoo.layers.FeedForward(512, dropout=0.25, output_dim=512, kernel_initializer="zeros", bias_initializer="ones")
    x = tf.ones((1, 16, 8))
    layer(x)
    layer.output_dense.kernel.assign(np.eye(512, dtype="float32"))
    step = tf.function(lambda: layer(x, training=True) - 1.0)  # less the unit output bias
    first, second = ops.convert_to_numpy(step()), ops.convert_to_numpy(step())
    np.testing.assert_allclose(np.unique(first), [0.0, 1 / 0.75], rtol=1e-6)
    assert abs((first == 0).mean() - 0.25) < 0.02
    assert not np.array_equal(first, second)


def test_token_cross_entropy_equals_keras_in_values_and_gradients():
    logits = tf.constant(random(2, 5, 11) * 3)
    labels = tf.constant(np.random.default_rng(1).integers(0, 11, (2, 5)), "int32")
    weights = tf.constant(np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], "float32"))
    theirs = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight")
    ours = kzoo.models.TokenCrossEntropy()

    def value_and_grad(loss):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            value = loss(labels, logits, sample_weight=weights)
        return value, tape.gradient(value, logits)

    want = value_and_grad(theirs)
    for got in (value_and_grad(ours), tf.function(lambda: value_and_grad(ours))()):
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
        np.testing.assert_allclose(got[1], want[1], atol=1e-7)
    # Labels with a trailing axis of 1, as Keras accepts them.
    np.testing.assert_allclose(
        kzoo.models.token_cross_entropy(labels[..., None], logits), kzoo.models.token_cross_entropy(labels, logits)
    )


def test_token_cross_entropy_rejects_labels_outside_the_classes():
    logits = tf.zeros((1, 3, 4))
    for labels in ([[0, 4, 1]], [[0, -1, 1]]):
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"`labels` must be in \[0, 4\)"):
            tf.function(lambda: kzoo.models.token_cross_entropy(tf.constant(labels), logits))()
    # XLA drops assertions: the bad position's loss is NaN, the others are log 4.
    compiled = tf.function(lambda: kzoo.models.token_cross_entropy(tf.constant([[0, 4, 1]]), logits), jit_compile=True)
    np.testing.assert_allclose(compiled(), [[np.log(4), np.nan, np.log(4)]], rtol=1e-6)


def test_token_cross_entropy_round_trips_through_its_config():
    loss = kzoo.models.TokenCrossEntropy(reduction="sum")
    again = keras.losses.deserialize(keras.losses.serialize(loss))
    assert isinstance(again, kzoo.models.TokenCrossEntropy) and again.reduction == "sum"


def test_gelu_approximate_is_gpt2_s_tanh_gelu():
    x = np.linspace(-6, 6, 1001).astype("float32")
    want = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(kzoo.layers.feed_forward.gelu_approximate(x), want, atol=2e-6)


# Hand-written gradients (`fused(..., vjp=...)`) against TensorFlow's own
# differentiation of the same function run eagerly, with dropout on: the same
# noise drops the same entries on both paths.


def _values_and_grads(run, tensors, compiled):
    """`run(*tensors)` and the gradients of a weighted sum of it, eagerly or in a graph (fused)."""

    def go():
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            outputs = tf.nest.flatten(run(*tensors))
            loss = sum(ops.sum(ops.cast(y, "float32") * random(*y.shape, seed=9 + i)) for i, y in enumerate(outputs))
        return outputs + tape.gradient(loss, tensors)

    return tf.function(go)() if compiled else go()


def _assert_same(run, tensors, tolerance=1e-5):
    want, got = _values_and_grads(run, tensors, False), _values_and_grads(run, tensors, True)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("both", [False, True])
def test_the_attention_softmax_gradient_is_autodiff_s(both):
    from kzoo.layers.scaled_dot_product_attention import _dropped_weights
    from kzoo.layers.scaled_dot_product_attention import _dropped_weights_vjp

    scores = tf.constant(random(2, 3, 4, 6) * 2)
    mask = np.ones((2, 1, 4, 6), bool)
    mask[0, :, 1] = False  # a query with no key
    mask[1, :, :, 4:] = False
    noise = dropout_noise((2, 3, 4, 6), 0.3, seed=5)
    run = lambda s: fused(_dropped_weights, s, mask, noise, vjp=_dropped_weights_vjp, scale=0.5, rate=0.3, both=both)  # noqa: E731
    _assert_same(run, [scores])


def _layer_norm(**kwargs):
    norm = keras.layers.LayerNormalization(epsilon=1e-3, **kwargs)
    norm.build((None, 16))
    for weight, seed in zip(norm.trainable_weights, (3, 4)):
        weight.assign(random(16, seed=seed) + 0.5)
    return norm


@pytest.mark.parametrize("settings", [{}, {"center": False}])
def test_the_residual_layer_norm_gradients_are_autodiff_s(settings):
    from kzoo.layers._fused_norm import add_dropped_normalize
    from kzoo.layers._fused_norm import normalize

    norm = _layer_norm(**settings)  # without beta: no written-out gradient, the autodiff fallback
    x, y = tf.constant(random(2, 5, 16) * 3 + 1), tf.constant(random(2, 5, 16, seed=1))
    noise = dropout_noise((2, 5, 16), 0.2, seed=6)
    variables = [v.value for v in norm.trainable_weights]
    _assert_same(lambda x, y, *_: add_dropped_normalize(norm, x, y, noise, 0.2), [x, y, *variables])
    _assert_same(lambda x, *_: normalize(norm, x), [x, *variables])
    _assert_same(lambda x, y: add_dropped_normalize(None, x, y, noise, 0.2), [x, y])
    eager = ops.convert_to_numpy(norm(x + dropout(y, noise, 0.2)))
    np.testing.assert_allclose(_values_and_grads(lambda x, y: add_dropped_normalize(norm, x, y, noise, 0.2), [x, y], True)[0], eager, atol=1e-5)


def test_the_bert_embedding_norm_gradient_is_autodiff_s():
    from kzoo.layers._fused_norm import normalize_dropped
    from kzoo.models.bert.bert_backbone import LayerNormalization

    norm = LayerNormalization(0.3, epsilon=1e-12)
    a, b, c = (tf.constant(random(2, 5, 16, seed=i)) for i in range(3))
    norm([a, b, c])
    norm.gamma.assign(random(16, seed=3) + 1)
    # The layer draws new noise per call; hold it fixed to compare the two paths.
    noise = dropout_noise((2, 5, 16), 0.3, seed=7)
    _assert_same(lambda a, b, c, *_: normalize_dropped(norm, [a, b, c], noise, 0.3), [a, b, c, norm.gamma.value, norm.beta.value])


@pytest.mark.parametrize("activation", ["gelu_approximate", "relu", "tanh"])
def test_the_feed_forward_activation_gradient_is_autodiff_s(activation):
    # tanh has no written-out derivative: the autodiff fallback.
    layer = kzoo.layers.FeedForward(24, activation=activation, dropout=0.25, bias_initializer="random_normal")
    x = tf.constant(random(2, 5, 8))
    layer(x)
    seed = layer.hidden_dropout.seed_generator
    start = ops.convert_to_numpy(seed.state)

    def run(x, *weights):
        seed.state.assign(start)  # the same noise on both paths
        return layer(x, training=True)

    _assert_same(run, [x, *[w.value for w in layer.trainable_weights]], tolerance=2e-5)


def test_sum_leading_axes_is_the_sum_over_all_but_the_last_axis():
    from kzoo.ops import sum_leading_axes

    x = random(3, 4, 5)
    np.testing.assert_allclose(sum_leading_axes(x), x.sum(axis=(0, 1)), rtol=1e-5)
    compiled = tf.function(lambda: sum_leading_axes(tf.constant(x)), jit_compile=True)
    np.testing.assert_allclose(compiled(), x.sum(axis=(0, 1)), rtol=1e-5)
