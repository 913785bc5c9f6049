import keras
from keras import ops

from kzoo.validation import check_positive_int


def check_sequence_length(length, sequence_length, start_index=0):
    """Raises when a statically known length does not fit the position table."""
    if isinstance(length, int) and isinstance(start_index, int):
        if start_index + length > sequence_length:
            raise ValueError(
                f"The input sequence length ({length}, starting at position "
                f"{start_index}) must be <= `sequence_length` ({sequence_length})."
            )


@keras.saving.register_keras_serializable(package="kzoo")
class PositionEmbedding(keras.layers.Layer):
    """A learned position embedding: one trainable vector per position.

    Returns the embeddings of positions `[start_index, start_index + T)`
    broadcast to the input's shape; add them to the token embeddings.

    Args:
        sequence_length: int, the number of positions in the table; longer
            inputs raise `ValueError`.
        initializer: initializer of the table.
        **kwargs: base layer arguments.

    Call args:
        inputs: tensor `(..., T, d)`; only its shape is used.
        start_index: int or scalar tensor, position of the first row.

    Example:
    >>> x = keras.random.normal((2, 10, 16))
    >>> tuple(PositionEmbedding(sequence_length=32)(x).shape)
    (2, 10, 16)
    """

    def __init__(self, sequence_length, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.sequence_length = check_positive_int("sequence_length", sequence_length)
        self.initializer = keras.initializers.get(initializer)
        self.supports_masking = True

    def build(self, input_shape):
        check_sequence_length(input_shape[-2], self.sequence_length)
        self.position_embeddings = self.add_weight(
            name="embeddings",
            shape=(self.sequence_length, input_shape[-1]),
            initializer=self.initializer,
        )
        self.built = True

    def call(self, inputs, start_index=0):
        shape = ops.shape(inputs)
        check_sequence_length(shape[-2], self.sequence_length, start_index)
        table = ops.convert_to_tensor(self.position_embeddings)
        positions = ops.slice(table, (start_index, 0), (shape[-2], shape[-1]))
        return ops.broadcast_to(positions, shape)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            sequence_length=self.sequence_length,
            initializer=keras.initializers.serialize(self.initializer),
        )
        return config
