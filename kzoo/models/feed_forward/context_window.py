import keras
from keras import ops

from kzoo.validation import check_positive_int


@keras.saving.register_keras_serializable(package="kzoo")
class ContextWindow(keras.layers.Layer):
    """The vectors of the last `window_size` positions, concatenated at each position.

    Position t gets x_t' = [x_{t-n+1}; ...; x_{t-1}; x_t], oldest first, for
    all t at once: n shifted copies of the sequence, concatenated on the
    feature axis. A window that reaches before the start of the sequence, or
    over a padded position, reads zero vectors there, so an output depends
    only on the real tokens in its window: left padding changes nothing.

    Masking: the input's Keras mask (id 0 is padding) zeroes the padded
    vectors and is passed on unchanged, `(B, T)`.

    Args:
        window_size: int n >= 1, the positions each window spans (t itself
            included).
        **kwargs: base layer arguments.

    Example:
    >>> x = keras.ops.reshape(keras.ops.arange(1.0, 4.0), (1, 3, 1))
    >>> keras.ops.convert_to_numpy(ContextWindow(2)(x))[0].tolist()
    [[0.0, 1.0], [1.0, 2.0], [2.0, 3.0]]
    """

    def __init__(self, window_size, **kwargs):
        super().__init__(**kwargs)
        self.window_size = check_positive_int("window_size", window_size)
        self.supports_masking = True

    def call(self, inputs, mask=None):
        if mask is not None:
            inputs = inputs * ops.cast(ops.expand_dims(mask, -1), inputs.dtype)
        length = ops.shape(inputs)[1]
        padded = ops.pad(inputs, [[0, 0], [self.window_size - 1, 0], [0, 0]])  # (B, n - 1 + T, d)
        # Copy k holds x_{t-n+1+k} at position t.
        shifted = [padded[:, k : k + length] for k in range(self.window_size)]
        return ops.concatenate(shifted, axis=-1)  # (B, T, n * d)

    def compute_output_shape(self, input_shape):
        width = None if input_shape[-1] is None else self.window_size * input_shape[-1]
        return (*input_shape[:-1], width)

    def get_config(self):
        config = super().get_config()
        config.update(window_size=self.window_size)
        return config
