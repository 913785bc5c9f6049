"""The softmax cross-entropy of integer labels as a fused op."""

from keras import ops

from kzoo.ops._fusion import run_op


def sparse_softmax_cross_entropy(labels, logits):
    """`-log softmax(logits)[label]` per position, in float32 whatever the logits' dtype.

    As `logsumexp(logits) - logits[label]`. Fused (where `kzoo.config` lets
    it) in every TensorFlow graph, evaluation included; TensorFlow
    differentiates the fused forward. Labels must be in range: see
    `kzoo.models.token_cross_entropy` for the checked loss.

    Args:
        labels: integer tensor `(...)`.
        logits: float tensor `(..., num_classes)`, `num_classes` known.

    Returns:
        float32 tensor `(...)`.

    Example:
    >>> keras.ops.convert_to_numpy(sparse_softmax_cross_entropy(keras.ops.array([1]), keras.ops.zeros((1, 4))))  # log 4
    array([1.3862944], dtype=float32)
    """
    return run_op(_reference, _forward, None, (labels, logits), {}, training=True)


def _reference(labels, logits):
    logits = ops.cast(logits, "float32")
    # The label's logit by a select and a sum, not a gather: a gather's gradient
    # is a scatter, which XLA runs many times slower.
    classes = ops.arange(logits.shape[-1], dtype="int32")
    picked = ops.sum(ops.where(classes == ops.expand_dims(labels, -1), logits, 0.0), axis=-1)
    return ops.logsumexp(logits, axis=-1) - picked


def _forward(labels, logits):
    return _reference(labels, logits), ()
