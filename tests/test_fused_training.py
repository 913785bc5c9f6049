"""kzoo's fused ops against their references, the switch, and the dropout and loss they use.

Each op in `kzoo.ops` runs its reference implementation (plain keras.ops) or,
in a TensorFlow training graph with fusion on, its fused one (one XLA
computation forward and one backward, the gradient written out). These tests
trace the same training computation twice, fusion on and off, and compare
values and gradients with dropout off and on (an int seed draws the same noise
on both runs); they check the references against independent arithmetic, and
that the switch, inference and whole-model XLA never fuse.
"""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

import kzoo
from kzoo.ops import dropout
from kzoo.ops import dropout_noise
from kzoo.ops.attention import MASKED_SCORE


@pytest.fixture(autouse=True)
def _fusion_on_after_each_test():
    yield
    kzoo.config.set_fused_training(True)


def random(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def xla_functions(concrete_function):
    """How many distinct functions in the traced graph XLA must compile (the fused ops' forwards and gradients)."""
    library = concrete_function.graph.as_graph_def().library.function
    return sum(1 for f in library if f.attr["_XlaMustCompile"].b)


def trace(run, tensors, fused):
    """`run(*tensors)` and the gradients of a weighted sum of its outputs, in one traced graph."""
    kzoo.config.set_fused_training(fused)

    def go(*tensors):
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            outputs = tf.nest.flatten(run(*tensors))
            loss = sum(ops.sum(ops.cast(y, "float32") * random(*y.shape, seed=9 + i)) for i, y in enumerate(outputs))
        return outputs + tape.gradient(loss, list(tensors))

    function = tf.function(go).get_concrete_function(*tensors)
    return [ops.convert_to_numpy(t) for t in function(*tensors)], xla_functions(function)


def assert_fused_equals_reference(run, tensors, tolerance=1e-5):
    want, plain_compiled = trace(run, tensors, fused=False)
    got, fused_compiled = trace(run, tensors, fused=True)
    assert plain_compiled == 0 and fused_compiled >= 1  # the two runs took different paths
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=tolerance, atol=tolerance)
    return got


RATES = [0.0, 0.3]


def _mask():
    mask = np.ones((2, 1, 4, 6), bool)
    mask[0, :, 1] = False  # query 1 of example 0 has no key
    mask[1, :, :, 4:] = False
    return mask


@pytest.mark.parametrize("rate", RATES)
@pytest.mark.parametrize("return_undropped", [False, True])
@pytest.mark.parametrize("as_bias", [False, True])
def test_softmax_dropout_fused_equals_reference(rate, return_undropped, as_bias):
    scores = tf.constant(random(2, 3, 4, 6) * 2)
    # The mask, or a causal one as an additive bias (every row keeps a key).
    mask, bias = (
        (None, tf.constant(np.triu(np.full((4, 6), MASKED_SCORE, "float32"), 1))) if as_bias else (_mask(), None)
    )

    def run(scores):
        return kzoo.ops.softmax_dropout(
            scores, mask, bias=bias, scale=0.5, rate=rate, seed=5, training=True, return_undropped=return_undropped
        )

    assert_fused_equals_reference(run, [scores])


def test_softmax_dropout_reference_is_the_masked_softmax_with_key_less_rows_zero():
    scores = random(2, 3, 4, 6)
    weights = ops.convert_to_numpy(kzoo.ops.softmax_dropout(scores, _mask(), scale=0.5))
    exp = np.where(_mask(), np.exp(0.5 * scores), 0.0)
    want = np.divide(exp, exp.sum(-1, keepdims=True), out=np.zeros_like(exp), where=exp.sum(-1, keepdims=True) > 0)
    np.testing.assert_allclose(weights, want, rtol=1e-5, atol=1e-7)
    # Dropout in training: the same weights rescaled where kept, zero elsewhere.
    dropped = kzoo.ops.softmax_dropout(scores, _mask(), scale=0.5, rate=0.5, seed=1, training=True)
    dropped = ops.convert_to_numpy(dropped)
    kept = dropped != 0
    np.testing.assert_allclose(dropped[kept], 2 * want[kept], rtol=1e-5)
    assert 0.35 < kept[want > 0].mean() < 0.65


def test_one_key_attention_weighs_it_fully_without_a_warning():
    """A query with one key (position 0, a one-token prefill) gets weight 1 for it, 0 if it is
    masked, NaN for a NaN score, as Keras' softmax gives, without Keras' warning that a softmax
    over one value is likely a mistake."""
    scores = np.array([[[0.7]], [[-3.0]], [[np.nan]]], "float32")  # (3, 1, 1): one query, one key
    mask = np.array([[[True]], [[False]], [[True]]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        weights = ops.convert_to_numpy(kzoo.ops.softmax_dropout(scores, mask))
        unmasked = ops.convert_to_numpy(kzoo.ops.softmax_dropout(scores))
    np.testing.assert_array_equal(weights.ravel(), [1.0, 0.0, np.nan])
    np.testing.assert_array_equal(unmasked.ravel(), [1.0, 1.0, np.nan])
    with pytest.warns(UserWarning, match="softmax over axis -1 of a tensor of shape"):
        np.testing.assert_array_equal(ops.convert_to_numpy(ops.softmax(scores, axis=-1)), unmasked)


def _gamma_beta(d, seed=3):
    return tf.constant(random(d, seed=seed) + 1.0), tf.constant(random(d, seed=seed + 1))


@pytest.mark.parametrize("rate", RATES)
def test_residual_dropout_layer_norm_fused_equals_reference(rate):
    x, y = tf.constant(random(2, 5, 16) * 3 + 1), tf.constant(random(2, 5, 16, seed=1))
    gamma, beta = _gamma_beta(16)

    def run(x, y, gamma, beta):
        return kzoo.ops.residual_dropout_layer_norm(x, y, gamma, beta, epsilon=1e-3, rate=rate, seed=6, training=True)

    assert_fused_equals_reference(run, [x, y, gamma, beta])


def test_layer_norm_fused_equals_reference_and_keras():
    x = tf.constant(random(2, 5, 16) * 3 + 1)
    gamma, beta = _gamma_beta(16)
    got = assert_fused_equals_reference(
        lambda x, gamma, beta: kzoo.ops.layer_norm(x, gamma, beta, epsilon=1e-3, training=True), [x, gamma, beta]
    )
    keras_norm = keras.layers.LayerNormalization(epsilon=1e-3)
    keras_norm.build(x.shape)
    keras_norm.set_weights([gamma.numpy(), beta.numpy()])
    np.testing.assert_allclose(got[0], keras_norm(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rate", [0.3])
def test_residual_dropout_fused_equals_reference_and_drops_y_only(rate):
    x, y = tf.constant(random(2, 5, 16)), tf.constant(random(2, 5, 16, seed=1))
    run = lambda x, y: kzoo.ops.residual_dropout(x, y, rate=rate, seed=2, training=True)  # noqa: E731
    got = assert_fused_equals_reference(run, [x, y])
    kept = got[0] != x.numpy()
    np.testing.assert_allclose(got[0][kept], (x.numpy() + y.numpy() / (1 - rate))[kept], rtol=1e-5)
    assert abs(kept.mean() - (1 - rate)) < 0.15


@pytest.mark.parametrize("rate", RATES)
@pytest.mark.parametrize("activation", ["gelu_approximate", "relu", "tanh"])
def test_bias_activation_dropout_fused_equals_reference(activation, rate):
    # tanh has no written-out derivative: TensorFlow differentiates the fused forward.
    x, bias = tf.constant(random(2, 5, 24)), tf.constant(random(24, seed=1))

    def run(x, bias):
        return kzoo.ops.bias_activation_dropout(x, bias, activation=activation, rate=rate, seed=4, training=True)

    got = assert_fused_equals_reference(run, [x, bias], tolerance=2e-5)
    if rate == 0:
        want = kzoo.ops.get_activation(activation)(x + bias)
        np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)


def test_sparse_softmax_cross_entropy_fused_equals_reference():
    logits = tf.constant(random(2, 5, 11) * 3)
    labels = np.random.default_rng(1).integers(0, 11, (2, 5)).astype("int32")
    assert_fused_equals_reference(lambda logits: kzoo.ops.sparse_softmax_cross_entropy(labels, logits), [logits])


def test_the_fused_ops_compile_once_for_every_layer_of_a_model():
    """A deeper model of equal layers compiles no more fused computations: they are shared."""

    def compiled(num_layers):
        backbone = kzoo.models.GPTBackbone(
            vocabulary_size=50,
            num_layers=num_layers,
            num_heads=2,
            hidden_dim=16,
            intermediate_dim=32,
            max_sequence_length=8,
            dropout=0.1,
        )
        ids = tf.ones((2, 8), "int32")

        def step():
            with tf.GradientTape() as tape:
                loss = ops.sum(backbone({"token_ids": ids, "padding_mask": ids}, training=True))
            return tape.gradient(loss, backbone.trainable_weights)

        return xla_functions(tf.function(step).get_concrete_function())

    one, three = compiled(1), compiled(3)
    # layer_norm, residual_dropout, softmax_dropout, bias_activation_dropout: a forward and a gradient each.
    assert one == three == 8


def _block_step(block, x, training):
    def step():
        with tf.GradientTape() as tape:
            y = block(x, training=training)
            loss = ops.sum(ops.square(y))
        return [y, *tape.gradient(loss, block.trainable_weights)]

    return tf.function(step).get_concrete_function()


def test_the_switch_inference_and_whole_model_xla_run_the_references():
    block = kzoo.layers.TransformerEncoderBlock(2, 32, dropout=0.1)
    x = tf.constant(random(2, 6, 16))
    block(x)
    assert xla_functions(_block_step(block, x, training=True)) > 0
    assert xla_functions(_block_step(block, x, training=False)) == 0
    kzoo.config.set_fused_training(False)
    assert not kzoo.config.is_fused_training_enabled()
    assert xla_functions(_block_step(block, x, training=True)) == 0
    kzoo.config.set_fused_training(True)
    # Under jit_compile the whole step is one XLA computation, with nothing compiled on its own inside.
    compiled = tf.function(lambda: block(x, training=True), jit_compile=True).get_concrete_function()
    assert xla_functions(compiled) == 0
    with pytest.raises(ValueError, match="`enabled` must be a bool"):
        kzoo.config.set_fused_training("no")


@pytest.mark.parametrize("norm_first", [False, True])
def test_a_block_trains_fused_as_it_trains_plain(norm_first):
    """A whole decoder block, dropout on: fused and plain training steps agree in values and gradients."""
    block = kzoo.layers.TransformerDecoderBlock(
        2, 32, dropout=0.2, activation="gelu_approximate", norm_first=norm_first
    )
    x, encoded = tf.constant(random(2, 6, 16)), tf.constant(random(2, 3, 16, seed=1))
    masks = dict(
        padding_mask=np.array([[1, 1, 1, 1, 0, 0], [1] * 6], bool),
        encoder_padding_mask=np.array([[1, 1, 0], [1, 1, 1]], bool),
    )
    block(x, encoded, **masks)
    weights = [w.value for w in block.trainable_weights]
    seeds = [getattr(layer, "seed_generator", None) for layer in block._flatten_layers()]  # the block's included
    seeds = [seed for seed in seeds if seed is not None]
    start = [ops.convert_to_numpy(s.state) for s in seeds]

    def run(x, encoded, *weights):
        for seed, state in zip(seeds, start):  # the same noise on both runs
            seed.state.assign(state)
        return block(x, encoded, **masks, training=True)

    assert_fused_equals_reference(run, [x, encoded, *weights], tolerance=1e-4)


# Dropout from drawn noise.


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


def test_inside_whole_model_xla_the_noise_is_uniform_floats():
    seed = keras.random.SeedGenerator(1)
    noise = tf.function(lambda: dropout_noise((4, 5), 0.1, seed), jit_compile=True)()
    assert tuple(noise.shape) == (4, 5) and noise.dtype == "float32"
    np.testing.assert_allclose(
        dropout(ops.ones((3,)), ops.array([0.05, 0.1, 0.9]), 0.1), [0.0, 1 / 0.9, 1 / 0.9], rtol=1e-6
    )


def test_training_dropout_drops_at_the_rate_and_differs_per_call():
    # Every hidden unit is relu(0 x + 1) = 1; the identity output kernel copies them out.
    layer = kzoo.layers.FeedForward(
        512, dropout=0.25, output_dim=512, kernel_initializer="zeros", bias_initializer="ones"
    )
    x = tf.ones((1, 16, 8))
    layer(x)
    layer.output_dense.kernel.assign(np.eye(512, dtype="float32"))
    step = tf.function(lambda: layer(x, training=True) - 1.0)  # less the unit output bias
    first, second = ops.convert_to_numpy(step()), ops.convert_to_numpy(step())
    np.testing.assert_allclose(np.unique(first), [0.0, 1 / 0.75], rtol=1e-6)
    assert abs((first == 0).mean() - 0.25) < 0.02
    assert not np.array_equal(first, second)


# The loss.


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
    np.testing.assert_allclose(kzoo.ops.gelu_approximate(x), want, atol=2e-6)


def test_sum_leading_axes_is_the_sum_over_all_but_the_last_axis():
    from kzoo.ops._fusion import sum_leading_axes

    x = random(3, 4, 5)
    np.testing.assert_allclose(sum_leading_axes(x), x.sum(axis=(0, 1)), rtol=1e-5)
    compiled = tf.function(lambda: sum_leading_axes(tf.constant(x)), jit_compile=True)
    np.testing.assert_allclose(compiled(), x.sum(axis=(0, 1)), rtol=1e-5)
