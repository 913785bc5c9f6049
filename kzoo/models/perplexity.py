import keras
from keras import ops

from kzoo._compat import keras_mask
from kzoo.models.cross_entropy import token_cross_entropy


@keras.saving.register_keras_serializable(package="kzoo")
class Perplexity(keras.metrics.Metric):
    """Perplexity: exp of the mean per-token cross-entropy.

    PPL = exp(sum_t w_t * CE_t / sum_t w_t), accumulated over all batches of
    an epoch (not the mean of per-batch perplexities, which would weight
    short batches wrongly). Pass the padding mask as `sample_weight` (compile
    with `weighted_metrics`) so padded tokens do not count; a Keras mask
    carried by `y_pred` (as the logits of kzoo's RNN models carry) is applied
    too, as Keras' own metrics do. Computed in
    float32 whatever the logits' dtype.

    Args:
        from_logits: bool, whether `y_pred` holds logits (True) or
            probabilities.
        name: metric name.
        **kwargs: base metric arguments.

    Example:
    >>> metric = Perplexity()
    >>> metric.update_state([[1, 2]], keras.ops.zeros((1, 2, 4)))
    >>> float(metric.result())  # uniform over 4 tokens
    4.0
    """

    def __init__(self, from_logits=True, name="perplexity", **kwargs):
        super().__init__(name=name, **kwargs)
        self.from_logits = from_logits
        self.total_cross_entropy = self.add_variable(
            shape=(), initializer="zeros", dtype="float32", name="total_cross_entropy"
        )
        self.total_weight = self.add_variable(shape=(), initializer="zeros", dtype="float32", name="total_weight")

    def update_state(self, y_true, y_pred, sample_weight=None):
        mask = keras_mask(y_pred)
        if self.from_logits:
            cross_entropy = token_cross_entropy(y_true, y_pred)  # (B, T)
        else:
            cross_entropy = keras.losses.sparse_categorical_crossentropy(
                ops.convert_to_tensor(y_true), ops.cast(y_pred, "float32")
            )
        if sample_weight is None:
            sample_weight = ops.ones_like(cross_entropy)
        sample_weight = ops.broadcast_to(ops.cast(sample_weight, "float32"), ops.shape(cross_entropy))
        if mask is not None:
            sample_weight = sample_weight * ops.cast(mask, "float32")
        self.total_cross_entropy.assign_add(ops.sum(cross_entropy * sample_weight))
        self.total_weight.assign_add(ops.sum(sample_weight))

    def result(self):
        return ops.exp(ops.divide_no_nan(self.total_cross_entropy, self.total_weight))

    def reset_state(self):
        self.total_cross_entropy.assign(0.0)
        self.total_weight.assign(0.0)

    def get_config(self):
        config = super().get_config()
        config.update(from_logits=self.from_logits)
        return config
