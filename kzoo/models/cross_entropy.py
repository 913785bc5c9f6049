"""The token cross-entropy, as a loss; `Perplexity` and `Task.compile` share it."""

import keras
from keras import ops

from kzoo.ops import check_token_ids
from kzoo.ops import sparse_softmax_cross_entropy


def token_cross_entropy(labels, logits):
    """Per-position softmax cross-entropy of integer `labels` against `logits`.

    `-log softmax(logits)[label]`, in float32 whatever the logits' dtype, as
    `logsumexp(logits) - logits[label]`, through the fused op
    `kzoo.ops.sparse_softmax_cross_entropy` (one XLA computation in a
    TensorFlow graph, where it runs faster than
    `tf.nn.sparse_softmax_cross_entropy_with_logits`). A label outside
    `[0, num_classes)` raises (see `kzoo.ops.check_token_ids`), or under XLA
    gives a NaN loss.

    Args:
        labels: integer tensor `(...)`, or `(..., 1)`.
        logits: float tensor `(..., num_classes)`, `num_classes` known.

    Returns:
        float32 tensor `(...)`.

    Example:
    >>> float(token_cross_entropy(keras.ops.array([1]), keras.ops.zeros((1, 4)))[0])  # log 4
    1.3862943649291992
    """
    labels = ops.convert_to_tensor(labels)
    if len(labels.shape) == len(logits.shape):
        labels = ops.squeeze(labels, -1)
    labels, valid = check_token_ids(ops.cast(labels, "int32"), logits.shape[-1], name="labels")
    # XLA drops the check's assertion: there, a bad label's loss is NaN.
    return ops.where(valid, sparse_softmax_cross_entropy(labels, logits), float("nan"))


@keras.saving.register_keras_serializable(package="kzoo")
class TokenCrossEntropy(keras.losses.Loss):
    """Softmax cross-entropy loss of integer labels against logits.

    What `keras.losses.SparseCategoricalCrossentropy(from_logits=True)`
    computes, through `token_cross_entropy` (fused under TensorFlow, and
    raising on out-of-range labels on every backend). The default of
    `kzoo.models.Task.compile`.

    Args:
        reduction: a Keras loss reduction; the default averages over the
            positions with non-zero sample weight, so padding neither counts
            nor dilutes.
        name: loss name.
        dtype: the loss dtype.

    Example:
    >>> loss = TokenCrossEntropy()
    >>> float(loss([[1, 2]], keras.ops.zeros((1, 2, 4))))  # uniform over 4 classes: log 4
    1.3862943649291992
    """

    def __init__(self, reduction="mean_with_sample_weight", name="token_cross_entropy", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)

    def call(self, y_true, y_pred):
        return token_cross_entropy(y_true, y_pred)
