import keras
from keras import ops

from kzoo.validation import check_positive_int


@keras.saving.register_keras_serializable(package="kzoo")
class RotaryEmbedding(keras.layers.Layer):
    """Rotary position embedding (RoPE), applied to queries or keys.

    Rotates feature pairs `(x_j, x_{j + d/2})` by the angle
    `pos * max_wavelength^(-2j/d)`, so the dot product of a rotated query at
    position m and a rotated key at position n depends on m - n only. The
    pairing of the two halves is the GPT-NeoX / keras-hub convention.

    Args:
        max_wavelength: int, the base of the angles (10000 in the paper).
        scaling_factor: float >= 1, positions are divided by it (linear
            position interpolation for longer contexts).
        sequence_axis: int, the axis of the positions in the input.
        **kwargs: base layer arguments.

    Call args:
        inputs: tensor `(B, T, ..., d)` with an even `d`.
        start_index: int or scalar tensor, position of the first row.

    Example:
    >>> q = keras.random.normal((2, 10, 4, 8))  # (B, T, heads, head_dim)
    >>> RotaryEmbedding()(q).shape
    (2, 10, 4, 8)

    References:
        Su et al., "RoFormer: Enhanced Transformer with Rotary Position
        Embedding", 2021.
    """

    def __init__(self, max_wavelength=10000, scaling_factor=1.0, sequence_axis=1, **kwargs):
        super().__init__(**kwargs)
        self.max_wavelength = check_positive_int("max_wavelength", max_wavelength)
        if not scaling_factor >= 1.0:
            raise ValueError(f"`scaling_factor` must be >= 1; received scaling_factor={scaling_factor!r}.")
        self.scaling_factor = float(scaling_factor)
        self.sequence_axis = sequence_axis
        self.supports_masking = True
        self.built = True

    def call(self, inputs, start_index=0):
        dim = inputs.shape[-1]
        if dim is None or dim % 2:
            raise ValueError(f"The last axis of the input must be even; received {dim}.")
        rank = len(inputs.shape)
        axis = self.sequence_axis % rank
        length = ops.shape(inputs)[axis]
        positions = ops.cast(ops.arange(length) + start_index, "float32") / self.scaling_factor
        inverse_frequency = ops.power(float(self.max_wavelength), -ops.arange(0, dim, 2, dtype="float32") / dim)
        angles = positions[:, None] * inverse_frequency[None, :]  # (T, d/2)
        broadcast_shape = [1] * rank
        broadcast_shape[axis], broadcast_shape[-1] = length, dim // 2
        cos = ops.reshape(ops.cos(angles), broadcast_shape)
        sin = ops.reshape(ops.sin(angles), broadcast_shape)
        x1, x2 = ops.split(ops.cast(inputs, "float32"), 2, axis=-1)
        rotated = ops.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
        return ops.cast(rotated, inputs.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            max_wavelength=self.max_wavelength,
            scaling_factor=self.scaling_factor,
            sequence_axis=self.sequence_axis,
        )
        return config
