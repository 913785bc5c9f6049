import keras

from kzoo import ops as kzoo_ops


@keras.saving.register_keras_serializable(package="kzoo")
class LayerNormalization(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` whose training step runs `kzoo.ops.layer_norm`.

    The same layer, arguments and weights as Keras' (files that stored a
    Keras LayerNorm load into it); over the last axis with `gamma` and `beta`
    it computes through `kzoo.ops.layer_norm`, which in a TensorFlow training
    step is one fused computation with a written-out gradient (see
    `kzoo.config.set_fused_training`). Other settings (another axis, no
    `center` or `scale`) run Keras' own call. Keras' `rms_scaling=True` is
    refused: it divides by the variance's root, not by the root mean square,
    so it is not RMSNorm (Keras 3.16 deprecates it); use
    `kzoo.layers.RMSNormalization`.

    Args:
        **kwargs: `keras.layers.LayerNormalization` arguments (`epsilon`,
            `axis`, ...).

    Example:
    >>> tuple(LayerNormalization(epsilon=1e-5)(keras.random.normal((2, 3, 8))).shape)
    (2, 3, 8)
    """

    def __init__(self, **kwargs):
        if kwargs.get("rms_scaling"):
            raise ValueError(
                "`rms_scaling=True` scales by the variance, not the root mean square: it is not RMSNorm. "
                "Use kzoo.layers.RMSNormalization."
            )
        super().__init__(**kwargs)

    def _fusable(self, rank):
        """Whether `kzoo.ops.layer_norm` computes this layer (over the last axis of a `rank`-D input)."""
        axes = list(self.axis) if isinstance(self.axis, (list, tuple)) else [self.axis]
        last = [[-1]] if rank is None else [[-1], [rank - 1]]
        return self.center and self.scale and axes in last

    def call(self, inputs, training=None):
        if not self._fusable(len(inputs.shape)):
            return super().call(inputs)
        return kzoo_ops.layer_norm(inputs, self.gamma, self.beta, epsilon=self.epsilon, training=training)
