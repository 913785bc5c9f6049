"""The attention weights as one fused op: scale, bias, mask, softmax, key-less rows, dropout."""

from keras import ops

from kzoo.ops._fusion import run_op
from kzoo.ops.dropout import dropout
from kzoo.ops.dropout import training_noise

# Filled into masked scores before the softmax (or added to them, as a bias). The softmax
# runs in float32, so this is finite there whatever the compute dtype is, and
# exp(-1e9 + s - max) is exactly 0: masked keys get zero weight.
MASKED_SCORE = -1e9


def softmax_dropout(
    scores, mask=None, *, bias=None, scale=1.0, rate=0.0, seed=None, training=False, return_undropped=False
):
    """Attention weights: `Dropout(softmax(scores * scale + bias))` over the keys `mask` allows.

    The softmax is computed in float32 and returned in the scores' dtype.
    Masked keys get exactly zero weight, and a query row whose keys are all
    masked gets all-zero weights (not a uniform average).

    Args:
        scores: tensor `(..., T_q, T_k)`, the products `Q K^T`.
        mask: None or a boolean tensor broadcastable to `scores`; True where
            the query may attend to the key.
        bias: None or a float tensor broadcastable to `scores`, added to the
            scaled scores in float32 (a constant: the fused training op gives
            it no gradient). A mask given as 0 where allowed and
            `MASKED_SCORE` where not weighs the keys as `mask` does, with
            float adds (which LiteRT's XNNPack runs, where it leaves a boolean
            select to slower kernels), but does not zero key-less rows.
        scale: float, the factor applied to the scores first.
        rate: float in [0, 1), dropout on the weights in training.
        seed: a `keras.random.SeedGenerator` or int for the dropout.
        training: bool, whether dropout is active (and the op may run fused).
        return_undropped: bool; if True return `(weights, dropped)`, the
            weights before and after the dropout.

    Returns:
        The dropped weights, like `scores`; or `(weights, dropped)`.

    Example:
    >>> keras.ops.convert_to_numpy(softmax_dropout(keras.ops.zeros((1, 2)), keras.ops.array([[True, False]]))).tolist()
    [[1.0, 0.0]]
    """
    if mask is not None:
        mask = ops.cast(mask, "bool")
    noise = training_noise(ops.shape(scores), rate, seed, training)
    static = dict(scale=float(scale), rate=rate, both=bool(return_undropped))
    return run_op(_reference, _forward, _vjp, (scores, mask, bias, noise), static, training)


def _weights(scores, mask, bias, scale):
    """softmax(scores * scale + bias) in float32 over the keys `mask` allows, zero for its key-less rows."""
    dtype = scores.dtype
    scores = ops.cast(scores, "float32") * scale
    if bias is not None:
        scores = scores + ops.cast(bias, "float32")
    if mask is None:
        return ops.cast(_softmax(scores), dtype)
    weights = _softmax(ops.where(mask, scores, MASKED_SCORE))
    # A row with no key to attend to would be uniform; make it zero.
    has_key = ops.cast(ops.any(mask, axis=-1, keepdims=True), "float32")
    return ops.cast(weights * has_key, dtype)


def _softmax(scores):
    """The softmax over the last axis. Over one key (a query at position 0 of a causal mask,
    a one-token prefill) it is exp(s - s) = 1, which `ops.softmax` computes too, after a warning
    that a softmax over one value is likely a mistake: here it is not."""
    if scores.shape[-1] == 1:
        return ops.exp(scores - scores)
    return ops.softmax(scores, axis=-1)


def _reference(scores, mask, bias, noise, scale, rate, both):
    weights = _weights(scores, mask, bias, scale)
    dropped = dropout(weights, noise, rate)
    return (weights, dropped) if both else dropped


def _forward(scores, mask, bias, noise, scale, rate, both):
    """The reference's outputs, and the weights for the gradient."""
    weights = _weights(scores, mask, bias, scale)
    dropped = dropout(weights, noise, rate)
    return ((weights, dropped) if both else dropped), weights


def _vjp(weights, grads, scores, mask, bias, noise, scale, rate, both):
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
    return ops.cast(grad_scores, scores.dtype), None, None, None
