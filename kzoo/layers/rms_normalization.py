import keras
from keras import ops


@keras.saving.register_keras_serializable(package="kzoo")
class RMSNormalization(keras.layers.RMSNormalization):
    """Root-mean-square normalization: `x / sqrt(mean(x^2) + epsilon) * w`.

    The normalization of the Llama lineage: no mean is subtracted and there
    is no shift. The statistics are computed in float32 for every input dtype
    (by Keras' `ops.rms_normalization`), and the scale is applied as the
    Hugging Face reference applies it, so that half-precision outputs round
    the same way:

    - `unit_offset=False` (Llama, Mistral, Qwen): the normalized values are
      cast to the input dtype, then multiplied by `w` (initialized to ones).
    - `unit_offset=True` (Gemma): multiplied by `1 + w` in float32, then cast
      (`w` is initialized to zeros, so a fresh layer is the identity scale).

    The weight is Keras' `scale`, so files of `keras.layers.RMSNormalization`
    load into it.

    Args:
        epsilon: float > 0 added to the mean square.
        unit_offset: bool, scale by `1 + w` (Gemma) instead of `w`.
        **kwargs: `keras.layers.RMSNormalization` arguments (`axis`, `name`, ...).

    Example:
    >>> norm = RMSNormalization(epsilon=1e-6)
    >>> [round(float(v), 4) for v in norm(keras.ops.array([[3.0, 4.0]]))[0]]
    [0.8485, 1.1314]

    References:
        Zhang & Sennrich, "Root Mean Square Layer Normalization", 2019.
    """

    def __init__(self, epsilon=1e-6, unit_offset=False, **kwargs):
        if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not epsilon > 0:
            raise ValueError(f"`epsilon` must be a float > 0; received epsilon={epsilon!r}.")
        super().__init__(epsilon=float(epsilon), **kwargs)
        self.unit_offset = bool(unit_offset)

    def build(self, input_shape):
        axes = sorted(self.axis) if isinstance(self.axis, (list, tuple)) else [self.axis]
        self.axis = axes
        self.scale = self.add_weight(
            name="scale",
            shape=tuple(input_shape[axis] for axis in axes),
            initializer="zeros" if self.unit_offset else "ones",
        )
        self.built = True

    def call(self, x):
        normalized = ops.rms_normalization(ops.cast(x, "float32"), axis=self.axis, epsilon=self.epsilon)
        if self.unit_offset:
            return ops.cast(normalized * (1.0 + ops.cast(self.scale, "float32")), x.dtype)
        return ops.cast(normalized, x.dtype) * ops.cast(self.scale, x.dtype)

    def get_config(self):
        return {**super().get_config(), "unit_offset": self.unit_offset}
