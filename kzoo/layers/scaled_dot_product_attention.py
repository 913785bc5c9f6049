import math

from keras import ops

from kzoo.layers._validation import check_rate
from kzoo.ops import dropout
from kzoo.ops import dropout_noise
from kzoo.ops import fused

# Filled into masked scores before the softmax. The softmax runs in float32,
# so this is finite there whatever the compute dtype is.
_MASKED_SCORE = -1e9


def scaled_dot_product_attention(
    query,
    key,
    value,
    mask=None,
    scale=None,
    dropout_rate=0.0,
    training=None,
    return_scores=False,
    seed=None,
):
    """Scaled dot-product attention: softmax(Q K^T * scale) V.

    Works over the last two axes with any leading axes, so the textbook
    unbatched form `(T, d_k)` works as well as `(batch, heads, T, d_k)`.
    Leading axes broadcast (a key of shape `(B, 1, T, d)` serves all heads).

    The softmax is computed in float32 for every input dtype. Masked positions
    get exactly zero weight, and a query row whose keys are all masked gets
    all-zero weights, so its output is zeros rather than NaN or an average.

    Args:
        query: tensor `(..., T_q, d_k)`.
        key: tensor `(..., T_k, d_k)`.
        value: tensor `(..., T_k, d_v)`.
        mask: optional boolean tensor broadcastable to `(..., T_q, T_k)`;
            True means the query may attend to that key.
        scale: the factor applied to `Q K^T`; defaults to `1 / sqrt(d_k)`.
        dropout_rate: float in [0, 1), dropout on the attention weights when
            `training` is True.
        training: bool, whether dropout is active.
        return_scores: bool; if True also return the attention weights.
        seed: a `keras.random.SeedGenerator` or int for the dropout.

    Returns:
        The output `(..., T_q, d_v)`, and with `return_scores=True` a tuple
        `(output, weights)` with weights `(..., T_q, T_k)`.

    Example:
    >>> q = keras.random.normal((4, 8))  # 4 queries, d_k = 8
    >>> k = v = keras.random.normal((6, 8))
    >>> scaled_dot_product_attention(q, k, v).shape
    (4, 8)

    References:
        Vaswani et al., "Attention Is All You Need", 2017, eq. (1).
    """
    check_rate("dropout_rate", dropout_rate)
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    dtype = query.dtype
    if mask is not None:
        mask = ops.cast(mask, "bool")
    fuse = bool(training) and dropout_rate > 0.0
    if not fuse:
        # Scaling the queries costs T_q * d_k multiplies, scaling the scores T_q * T_k.
        query = query * ops.cast(scale, dtype)
    if query.shape[-2] == 1:
        # One query (a decoding step): K q^T reads the keys in their stored
        # (T_k, d_k) layout, where q K^T makes XLA:CPU copy them transposed
        # on every step.
        scores = ops.swapaxes(ops.matmul(key, ops.swapaxes(query, -1, -2)), -1, -2)
    else:
        scores = ops.matmul(query, ops.swapaxes(key, -1, -2))  # (..., T_q, T_k)
    if fuse:
        # Training: scale, mask, softmax, the zeroing of key-less rows and
        # dropout as one fused computation (`kzoo.ops.fused`), where scaling
        # the scores costs nothing.
        noise = dropout_noise(ops.shape(scores), dropout_rate, seed)
        weights = fused(
            _dropped_weights, scores, mask, noise, vjp=_dropped_weights_vjp, scale=scale, rate=dropout_rate, both=return_scores
        )
        weights, attended = weights if return_scores else (None, weights)
        output = ops.matmul(attended, value)
    else:
        weights = _weights(scores, mask, dtype)
        output = ops.matmul(weights, value)
        if mask is not None:
            # A row with no key to attend to would be uniform; make it zero.
            # The output (T_q, d_v) is cheaper to zero than the weights (T_q, T_k).
            has_key = _has_key(mask, dtype)
            output = output * has_key
            weights = weights * has_key
    if return_scores:
        return output, weights
    return output


def _has_key(mask, dtype):
    """1 for the query rows `mask` lets attend to some key, else 0: `(..., T_q, 1)`."""
    return ops.cast(ops.any(mask, axis=-1, keepdims=True), dtype)


def _weights(scores, mask, dtype, scale=None):
    """softmax(scores * scale) in float32 over the keys `mask` allows, cast to `dtype`."""
    scores = ops.cast(scores, "float32")
    if scale is not None:
        scores = scores * scale
    if mask is not None:
        # exp(-1e9 - max) is exactly 0 in float32: masked keys get zero weight.
        scores = ops.where(mask, scores, _MASKED_SCORE)
    return ops.cast(ops.softmax(scores, axis=-1), dtype)


def _dropped_weights(scores, mask, noise, scale, rate, both):
    """The weights after dropout, and with `both` the weights before it too.

    Rows without a key to attend to are zero in both. For `kzoo.ops.fused`
    with `_dropped_weights_vjp`: also returns the weights, for the gradient.
    """
    weights = _weights(scores, mask, scores.dtype, scale)
    if mask is not None:
        weights = weights * _has_key(mask, weights.dtype)
    dropped = dropout(weights, noise, rate)
    return ((weights, dropped) if both else dropped), weights


def _dropped_weights_vjp(weights, grads, scores, mask, noise, scale, rate, both):
    """The softmax gradient from the saved weights p: `p * (g - sum(g * p)) * scale`.

    `g` is the gradient of the weights: through the dropout (the same noise
    drops the same entries), plus the gradient of the undropped weights with
    `both`. Masked entries and key-less rows have p = 0, so they get none.
    """
    grad_weights, grad_dropped = grads if both else (None, grads)
    g = ops.cast(dropout(grad_dropped, noise, rate), "float32")
    if grad_weights is not None:
        g = g + ops.cast(grad_weights, "float32")
    p = ops.cast(weights, "float32")
    grad_scores = p * (g - ops.sum(g * p, axis=-1, keepdims=True)) * scale
    return ops.cast(grad_scores, scores.dtype), None, None
