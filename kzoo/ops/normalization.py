"""LayerNorm and the chains that end or start with it, as fused ops.

Reference implementations are Keras' own `ops.layer_normalization` (float32
statistics over the last axis, the output in the input's dtype), so a layer
infers exactly as `keras.layers.LayerNormalization` does. The fused
implementations keep only the row statistics (mean and 1/std, one number per
row each) for the gradient and read the arguments again; differentiated by
TensorFlow, each chain kept six full-size copies of its intermediates.
"""

from keras import ops

from kzoo.ops._fusion import run_op
from kzoo.ops._fusion import sum_leading_axes
from kzoo.ops.dropout import dropout
from kzoo.ops.dropout import training_noise


def layer_norm(x, gamma, beta, *, epsilon=1e-3, training=False):
    """LayerNorm over the last axis: `(x - mean) / sqrt(var + epsilon) * gamma + beta`.

    Args:
        x: tensor `(..., d)`.
        gamma: the scale `(d,)`.
        beta: the shift `(d,)`.
        epsilon: float added to the variance.
        training: bool; the fused implementation runs only in training
            (see `kzoo.config.set_fused_training`).

    Returns:
        A tensor like `x`, in `x`'s dtype.

    Example:
    >>> x = keras.ops.array([[1.0, 3.0]])  # mean 2, variance 1
    >>> keras.ops.convert_to_numpy(layer_norm(x, keras.ops.ones(2), keras.ops.zeros(2))).round(4)  # epsilon 1e-3
    array([[-0.9995,  0.9995]], dtype=float32)
    """
    return run_op(
        _layer_norm_reference,
        _layer_norm_forward,
        _layer_norm_vjp_op,
        (x, gamma, beta),
        dict(epsilon=epsilon),
        training,
    )


def residual_dropout_layer_norm(x, y, gamma, beta, *, epsilon=1e-3, rate=0.0, seed=None, training=False):
    """The post-LN residual: `LayerNorm(x + Dropout(y))`.

    The paper's "Add & Norm": dropout on a sublayer's output `y`, added to
    its input `x` and normalized. The sum is taken in `x`'s dtype and
    normalized in float32.

    Args:
        x: the residual stream `(..., d)`.
        y: the sublayer's output, shaped like `x`.
        gamma: the LayerNorm scale `(d,)`.
        beta: the LayerNorm shift `(d,)`.
        epsilon: float added to the variance.
        rate: float in [0, 1), dropout on `y` in training.
        seed: a `keras.random.SeedGenerator` or int for the dropout.
        training: bool, whether dropout is active (and the op may run fused).

    Example:
    >>> x = keras.random.normal((2, 4))
    >>> tuple(residual_dropout_layer_norm(x, x, keras.ops.ones(4), keras.ops.zeros(4)).shape)
    (2, 4)
    """
    noise = training_noise(ops.shape(y), rate, seed, training)
    return run_op(
        _residual_norm_reference,
        _residual_norm_forward,
        _residual_norm_vjp,
        (x, y, noise, gamma, beta),
        dict(rate=rate, epsilon=epsilon),
        training,
    )


def residual_dropout(x, y, *, rate=0.0, seed=None, training=False):
    """The pre-LN residual: `x + Dropout(y)`.

    Args:
        x: the residual stream.
        y: the sublayer's output, shaped like `x`.
        rate: float in [0, 1), dropout on `y` in training.
        seed: a `keras.random.SeedGenerator` or int for the dropout.
        training: bool, whether dropout is active (and the op may run fused).

    Example:
    >>> keras.ops.convert_to_numpy(residual_dropout(keras.ops.ones(3), keras.ops.ones(3))).tolist()
    [2.0, 2.0, 2.0]
    """
    noise = training_noise(ops.shape(y), rate, seed, training)
    if noise is None:
        return ops.add(x, y)
    return run_op(_residual_reference, _residual_forward, _residual_vjp, (x, y, noise), dict(rate=rate), training)


# Reference implementations: Keras' LayerNorm.


def _keras_layer_norm(x, gamma, beta, epsilon):
    return ops.layer_normalization(x, gamma, beta, epsilon=epsilon)


def _layer_norm_reference(x, gamma, beta, epsilon):
    return _keras_layer_norm(x, gamma, beta, epsilon)


def _residual_norm_reference(x, y, noise, gamma, beta, rate, epsilon):
    return _keras_layer_norm(ops.add(x, dropout(y, noise, rate)), gamma, beta, epsilon)


def _residual_reference(x, y, noise, rate):
    return ops.add(x, dropout(y, noise, rate))


# Fused implementations. Forward: (output, saved statistics); gradients: one per argument.


def _layer_norm(s, gamma, beta, epsilon, dtype):
    """Float32 `s` -> (LayerNorm(s) in `dtype`, (mean, 1/std))."""
    mean = ops.mean(s, axis=-1, keepdims=True)
    centered = s - mean
    inverse_std = ops.rsqrt(ops.mean(centered * centered, axis=-1, keepdims=True) + epsilon)
    y = centered * inverse_std * ops.cast(gamma, "float32") + ops.cast(beta, "float32")
    return ops.cast(y, dtype), (mean, inverse_std)


def _layer_norm_vjp(grad, s, gamma, stats):
    """Gradients of `_layer_norm` for s, gamma, beta (float32)."""
    mean, inverse_std = stats
    normalized = (s - mean) * inverse_std
    grad = ops.cast(grad, "float32")
    grad_gamma = sum_leading_axes(grad * normalized)
    grad_beta = sum_leading_axes(grad)
    g = grad * ops.cast(gamma, "float32")
    grad_s = inverse_std * (
        g - ops.mean(g, axis=-1, keepdims=True) - normalized * ops.mean(g * normalized, axis=-1, keepdims=True)
    )
    return grad_s, grad_gamma, grad_beta


def _layer_norm_forward(x, gamma, beta, epsilon):
    return _layer_norm(ops.cast(x, "float32"), gamma, beta, epsilon, x.dtype)


def _layer_norm_vjp_op(stats, grad, x, gamma, beta, epsilon):
    grad_x, grad_gamma, grad_beta = _layer_norm_vjp(grad, ops.cast(x, "float32"), gamma, stats)
    return ops.cast(grad_x, x.dtype), ops.cast(grad_gamma, gamma.dtype), ops.cast(grad_beta, beta.dtype)


def _residual_forward(x, y, noise, rate):
    return ops.add(x, dropout(y, noise, rate)), ()


def _residual_vjp(saved, grad, x, y, noise, rate):
    return ops.cast(grad, x.dtype), ops.cast(dropout(grad, noise, rate), y.dtype), None


def _residual_sum(x, y, noise, rate):
    # As `x + dropout(y)` in x's dtype, then float32 for the statistics.
    return ops.cast(ops.add(x, dropout(y, noise, rate)), "float32")


def _residual_norm_forward(x, y, noise, gamma, beta, rate, epsilon):
    return _layer_norm(_residual_sum(x, y, noise, rate), gamma, beta, epsilon, x.dtype)


def _residual_norm_vjp(stats, grad, x, y, noise, gamma, beta, rate, epsilon):
    grad_s, grad_gamma, grad_beta = _layer_norm_vjp(grad, _residual_sum(x, y, noise, rate), gamma, stats)
    grad_y = dropout(ops.cast(grad_s, y.dtype), noise, rate)
    return ops.cast(grad_s, x.dtype), grad_y, None, ops.cast(grad_gamma, gamma.dtype), ops.cast(grad_beta, beta.dtype)
