import keras
from keras import ops

from kzoo.validation import check_positive_int


@keras.saving.register_keras_serializable(package="kzoo")
class SinusoidalPositionEncoding(keras.layers.Layer):
    """The fixed sine/cosine position encoding of the Transformer paper.

    PE(pos, 2i) = sin(pos / max_wavelength^(2i/d)) and
    PE(pos, 2i+1) = cos(pos / max_wavelength^(2i/d)), interleaved along the
    feature axis. The layer returns the encoding (same shape as its input);
    add it to the token embeddings yourself. It has no weights.

    Args:
        max_wavelength: int, the longest wavelength (10000 in the paper).
        **kwargs: base layer arguments.

    Call args:
        inputs: tensor `(..., T, d)`; only its shape is used.
        start_index: int or scalar tensor, position of the first row
            (used when decoding one token at a time).

    Example:
    >>> x = keras.random.normal((2, 10, 16))
    >>> tuple((x + SinusoidalPositionEncoding()(x)).shape)
    (2, 10, 16)

    References:
        Vaswani et al., "Attention Is All You Need", 2017, sec. 3.5.
    """

    def __init__(self, max_wavelength=10000, **kwargs):
        super().__init__(**kwargs)
        self.max_wavelength = check_positive_int("max_wavelength", max_wavelength)
        self.supports_masking = True
        self.built = True

    def call(self, inputs, start_index=0):
        shape = ops.shape(inputs)
        length, dim = shape[-2], shape[-1]
        positions = ops.cast(ops.arange(length) + start_index, "float32")
        features = ops.arange(dim)
        exponent = ops.cast(2 * (features // 2), "float32") / ops.cast(dim, "float32")
        angles = positions[:, None] / ops.power(float(self.max_wavelength), exponent)[None, :]
        encoding = ops.where(features % 2 == 0, ops.sin(angles), ops.cos(angles))
        return ops.broadcast_to(ops.cast(encoding, self.compute_dtype), shape)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(max_wavelength=self.max_wavelength)
        return config
