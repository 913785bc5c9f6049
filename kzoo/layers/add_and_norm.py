import keras

from kzoo import ops as kzoo_ops
from kzoo.layers.layer_normalization import LayerNormalization
from kzoo.validation import check_rate


@keras.saving.register_keras_serializable(package="kzoo")
class AddAndNorm(LayerNormalization):
    """The post-LN residual connection: `LayerNorm(x + Dropout(y))`.

    The Transformer's "Add & Norm" (Figure 1 of the paper), with the dropout
    it applies "to the output of each sub-layer, before it is added to the
    sub-layer input and normalized" (sec. 5.4). The weights are a
    LayerNorm's; the whole chain is `kzoo.ops.residual_dropout_layer_norm`,
    one fused computation in a TensorFlow training step.

    Args:
        dropout: float in [0, 1), the dropout rate on `y` in training.
        seed: int or None, the seed of the dropout.
        **kwargs: `keras.layers.LayerNormalization` arguments (`epsilon`, ...).

    Example:
    >>> x, y = keras.random.normal((2, 3, 8)), keras.random.normal((2, 3, 8))
    >>> tuple(AddAndNorm(0.1)(x, y).shape)
    (2, 3, 8)

    References:
        Vaswani et al., "Attention Is All You Need", 2017, sec. 3.1 and 5.4.
    """

    def __init__(self, dropout=0.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        if not self._fusable(None):
            raise ValueError(
                "`AddAndNorm` normalizes over the last axis with `center` and `scale`; received "
                f"axis={self.axis}, center={self.center}, scale={self.scale}."
            )
        self.dropout = check_rate("dropout", dropout)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def build(self, x_shape, y_shape=None):
        super().build(x_shape)

    def call(self, x, y, training=None):
        """`x` the sublayer's input, `y` its output, of one shape."""
        return kzoo_ops.residual_dropout_layer_norm(
            x,
            y,
            self.gamma,
            self.beta,
            epsilon=self.epsilon,
            rate=self.dropout,
            seed=self.seed_generator,
            training=training,
        )

    def compute_output_shape(self, x_shape, y_shape=None):
        return x_shape

    def get_config(self):
        return {**super().get_config(), "dropout": self.dropout, "seed": self.seed}
