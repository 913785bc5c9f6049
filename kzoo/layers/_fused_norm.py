"""LayerNorm inside the fused training computations, with its gradient written out.

The blocks' residual `norm(x + dropout(y))`, the pre-LN `norm(x)` and BERT's
`dropout(norm(a + b + c))` run as `kzoo.ops.fused` computations in training.
Differentiated by TensorFlow, each kept six full-size copies of its
intermediates for the backward pass; the gradients here keep the row
statistics only (mean and 1/std, one number per row each) and read the
arguments again.

The arithmetic is `keras.layers.LayerNormalization`'s: float32 statistics over
the last axis, `gamma`/`beta` as the layer reads them, the output in the
layer's compute dtype. Layers with other settings (`rms_scaling`, no
`center`/`scale`, another axis) take `fused(norm, ...)` without `vjp`.
"""

import functools

import keras
from keras import ops

from kzoo.ops import dropout
from kzoo.ops import fused
from kzoo.ops import sum_leading_axes


def normalize(norm, x):
    """`norm(x)`."""
    if not _plain_layer_norm(norm, x):
        return fused(norm, x)
    return fused(_normalize, x, norm.gamma, norm.beta, vjp=_normalize_vjp, **_settings(norm))


def add_dropped_normalize(norm, x, y, noise, rate):
    """`norm(x + dropout(y))`, or `x + dropout(y)` when `norm` is None."""
    if norm is None:
        return fused(_add_dropped, x, y, noise, vjp=_add_dropped_vjp, rate=rate)
    if not _plain_layer_norm(norm, x):
        return fused(lambda x, y, noise: norm(ops.add(x, dropout(y, noise, rate))), x, y, noise)
    settings = _settings(norm)
    return fused(_add_dropped_normalize, x, y, noise, norm.gamma, norm.beta, vjp=_add_dropped_normalize_vjp, rate=rate, **settings)


def normalize_dropped(norm, inputs, noise, rate):
    """`dropout(norm(sum(inputs)))`, for a subclass of Keras' LayerNorm that takes `inputs`."""
    if not _plain_layer_norm(norm, inputs[0]):
        layer_norm = functools.partial(keras.layers.LayerNormalization.call, norm)
        return fused(lambda noise, *inputs: dropout(layer_norm(functools.reduce(ops.add, inputs)), noise, rate), noise, *inputs)
    settings = _settings(norm)
    return fused(_normalize_dropped, noise, norm.gamma, norm.beta, *inputs, vjp=_normalize_dropped_vjp, rate=rate, **settings)


def _plain_layer_norm(norm, x):
    """Whether `norm` is a LayerNorm over the last axis with gamma and beta."""
    axes = list(norm.axis) if isinstance(norm.axis, (list, tuple)) else [norm.axis]
    return norm.center and norm.scale and not norm.rms_scaling and axes in ([-1], [len(x.shape) - 1])


def _settings(norm):
    return dict(epsilon=norm.epsilon, dtype=norm.compute_dtype)


# Forward: (output, saved statistics). Gradients: one per argument.


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


def _normalize(x, gamma, beta, epsilon, dtype):
    return _layer_norm(ops.cast(x, "float32"), gamma, beta, epsilon, dtype)


def _normalize_vjp(stats, grad, x, gamma, beta, epsilon, dtype):
    grad_x, grad_gamma, grad_beta = _layer_norm_vjp(grad, ops.cast(x, "float32"), gamma, stats)
    return ops.cast(grad_x, x.dtype), ops.cast(grad_gamma, gamma.dtype), ops.cast(grad_beta, beta.dtype)


def _add_dropped(x, y, noise, rate):
    return ops.add(x, dropout(y, noise, rate)), ()


def _add_dropped_vjp(saved, grad, x, y, noise, rate):
    return ops.cast(grad, x.dtype), ops.cast(dropout(grad, noise, rate), y.dtype), None


def _residual_sum(x, y, noise, rate):
    # As `x + dropout(y)` in the compute dtype, then float32 for the statistics.
    return ops.cast(ops.add(x, dropout(y, noise, rate)), "float32")


def _add_dropped_normalize(x, y, noise, gamma, beta, rate, epsilon, dtype):
    return _layer_norm(_residual_sum(x, y, noise, rate), gamma, beta, epsilon, dtype)


def _add_dropped_normalize_vjp(stats, grad, x, y, noise, gamma, beta, rate, epsilon, dtype):
    grad_s, grad_gamma, grad_beta = _layer_norm_vjp(grad, _residual_sum(x, y, noise, rate), gamma, stats)
    grad_y = dropout(ops.cast(grad_s, y.dtype), noise, rate)
    return ops.cast(grad_s, x.dtype), grad_y, None, ops.cast(grad_gamma, gamma.dtype), ops.cast(grad_beta, beta.dtype)


def _input_sum(inputs):
    return ops.cast(functools.reduce(ops.add, inputs), "float32")


def _normalize_dropped(noise, gamma, beta, *inputs, rate, epsilon, dtype):
    y, stats = _layer_norm(_input_sum(inputs), gamma, beta, epsilon, dtype)
    return dropout(y, noise, rate), stats


def _normalize_dropped_vjp(stats, grad, noise, gamma, beta, *inputs, rate, epsilon, dtype):
    grad = dropout(grad, noise, rate)
    grad_s, grad_gamma, grad_beta = _layer_norm_vjp(grad, _input_sum(inputs), gamma, stats)
    grad_gamma, grad_beta = ops.cast(grad_gamma, gamma.dtype), ops.cast(grad_beta, beta.dtype)
    return (None, grad_gamma, grad_beta, *[ops.cast(grad_s, x.dtype) for x in inputs])
