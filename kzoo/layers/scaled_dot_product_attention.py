import math

from keras import ops

from kzoo import ops as kzoo_ops
from kzoo.validation import check_rate

# Up to this many queries (a decoding step's, grouped-query heads included), scores are K q^T.
FEW_QUERIES = 16


def scaled_dot_product_attention(
    query,
    key,
    value,
    mask=None,
    bias=None,
    scale=None,
    dropout_rate=0.0,
    training=None,
    return_scores=False,
    seed=None,
    soft_cap=None,
):
    """Scaled dot-product attention: softmax(Q K^T * scale) V.

    Works over the last two axes with any leading axes, so the textbook
    unbatched form `(T, d_k)` works as well as `(batch, heads, T, d_k)`.
    Leading axes broadcast (a key of shape `(B, 1, T, d)` serves all heads).

    The softmax is computed in float32 for every input dtype. Masked positions
    get exactly zero weight, and a query row whose keys are all masked gets
    all-zero weights, so its output is zeros rather than NaN or an average.
    Scale, mask, softmax and dropout are one op, `kzoo.ops.softmax_dropout`,
    fused in a TensorFlow training step.

    Args:
        query: tensor `(..., T_q, d_k)`.
        key: tensor `(..., T_k, d_k)`.
        value: tensor `(..., T_k, d_v)`.
        mask: optional boolean tensor broadcastable to `(..., T_q, T_k)`;
            True means the query may attend to that key.
        bias: optional float tensor broadcastable to `(..., T_q, T_k)`, added
            to the scaled (and soft-capped) scores before the softmax; a
            causal mask as 0 / `kzoo.ops.attention.MASKED_SCORE` gives the
            same weights as the boolean mask (see `kzoo.ops.softmax_dropout`).
        scale: the factor applied to `Q K^T`; defaults to `1 / sqrt(d_k)`.
        dropout_rate: float in [0, 1), dropout on the attention weights when
            `training` is True.
        training: bool, whether dropout is active.
        return_scores: bool; if True also return the attention weights.
        seed: a `keras.random.SeedGenerator` or int for the dropout.
        soft_cap: None or a float c > 0: the scaled scores s become
            `c * tanh(s / c)` before the softmax (Gemma 2's attention-logit
            soft-capping), in the scores' dtype as the reference computes it.

    Returns:
        The output `(..., T_q, d_v)`, and with `return_scores=True` a tuple
        `(output, weights)` with weights `(..., T_q, T_k)`.

    Example:
    >>> q = keras.random.normal((4, 8))  # 4 queries, d_k = 8
    >>> k = v = keras.random.normal((6, 8))
    >>> tuple(scaled_dot_product_attention(q, k, v).shape)
    (4, 8)

    References:
        Vaswani et al., "Attention Is All You Need", 2017, eq. (1).
    """
    check_rate("dropout_rate", dropout_rate)
    if soft_cap is not None and not soft_cap > 0:
        raise ValueError(f"`soft_cap` must be None or a number > 0; received soft_cap={soft_cap!r}.")
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    if query.shape[-2] is not None and query.shape[-2] <= FEW_QUERIES:
        # A decoding step (one query per head, or the few heads of a
        # key/value group stacked): K q^T reads the keys in their stored
        # (T_k, d_k) layout; q K^T would have XLA copy the whole cache
        # transposed on every step.
        scores = ops.swapaxes(ops.matmul(key, ops.swapaxes(query, -1, -2)), -1, -2)
    else:
        scores = ops.matmul(query, ops.swapaxes(key, -1, -2))  # (..., T_q, T_k)
    if soft_cap is not None:
        scores = ops.tanh(scores * (scale / soft_cap)) * soft_cap
        scale = 1.0
    weights = kzoo_ops.softmax_dropout(
        scores,
        mask,
        bias=bias,
        scale=scale,
        rate=dropout_rate,
        seed=seed,
        training=training,
        return_undropped=return_scores,
    )
    weights, dropped = weights if return_scores else (None, weights)
    output = ops.matmul(dropped, value)  # (..., T_q, d_v)
    if return_scores:
        return output, weights
    return output
