import math

import keras
from keras import ops

from kzoo.layers.position_embedding import PositionEmbedding
from kzoo.layers.position_embedding import check_sequence_length
from kzoo.layers.sinusoidal_position_encoding import SinusoidalPositionEncoding
from kzoo.ops import check_token_ids
from kzoo.validation import check_choice
from kzoo.validation import check_positive_int


@keras.saving.register_keras_serializable(package="kzoo")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """Token embedding plus position information, with id checks.

    Looks up each token id, optionally scales the vectors by sqrt(d) (the
    Transformer paper, sec. 3.4), and adds or concatenates a learned or
    sinusoidal position vector. Ids outside `[0, vocabulary_size)` raise an
    error on every backend (see `kzoo.ops.check_token_ids`) instead of the
    silent zeros or clamped rows that embedding lookups give on GPU and XLA;
    where a backend cannot raise (TensorFlow XLA), such rows are NaN.

    With `mask_zero=True`, id 0 is padding: the output carries a Keras mask
    that attention blocks downstream pick up.

    Args:
        vocabulary_size: int, the number of token ids.
        sequence_length: int, the longest sequence (the learned table's size).
        embedding_dim: int, the width d of the token vectors.
        position: "learned", "sinusoidal" or "none".
        merge: "add" (output width d) or "concat" (output width 2d).
        mask_zero: bool, whether id 0 is padding.
        scale_embeddings: bool, multiply the token vectors by sqrt(d).
        embeddings_initializer: initializer of the token table.
        **kwargs: base layer arguments.

    Call args:
        token_ids: int tensor `(B, T)`.
        start_index: int or scalar tensor, position of the first token.

    Example:
    >>> embed = TokenAndPositionEmbedding(100, 16, 8, mask_zero=True)
    >>> tuple(embed(keras.ops.array([[5, 7, 0]])).shape)
    (1, 3, 8)
    """

    def __init__(
        self,
        vocabulary_size,
        sequence_length,
        embedding_dim,
        position="learned",
        merge="add",
        mask_zero=False,
        scale_embeddings=False,
        embeddings_initializer="uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocabulary_size = check_positive_int("vocabulary_size", vocabulary_size)
        self.sequence_length = check_positive_int("sequence_length", sequence_length)
        self.embedding_dim = check_positive_int("embedding_dim", embedding_dim)
        self.position = check_choice("position", position, ("learned", "sinusoidal", "none"))
        self.merge = check_choice("merge", merge, ("add", "concat"))
        if position == "none" and merge == "concat":
            raise ValueError('`merge="concat"` needs a position encoding; received position="none".')
        self.mask_zero = mask_zero
        self.scale_embeddings = scale_embeddings
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.token_embedding = keras.layers.Embedding(
            vocabulary_size,
            embedding_dim,
            embeddings_initializer=self.embeddings_initializer,
            dtype=self.dtype_policy,
            name="token_embedding",
        )
        if position == "learned":
            self.position_embedding = PositionEmbedding(
                sequence_length, dtype=self.dtype_policy, name="position_embedding"
            )
        elif position == "sinusoidal":
            self.position_embedding = SinusoidalPositionEncoding(dtype=self.dtype_policy, name="position_embedding")
        else:
            self.position_embedding = None

    def build(self, token_ids_shape):
        check_sequence_length(token_ids_shape[-1], self.sequence_length)
        self.token_embedding.build(token_ids_shape)
        if self.position_embedding is not None:
            self.position_embedding.build((*token_ids_shape, self.embedding_dim))
        self.built = True

    @property
    def embeddings(self):
        """The token table `(vocabulary_size, embedding_dim)`, for tied output layers."""
        return self.token_embedding.embeddings

    def call(self, token_ids, start_index=0):
        check_sequence_length(token_ids.shape[-1], self.sequence_length, start_index)
        token_ids, valid = check_token_ids(token_ids, self.vocabulary_size, "token_ids")
        # One lookup over the ids as a flat list: exported, a 1-D table lookup, which LiteRT has as
        # EMBEDDING_LOOKUP, an op Google's quantizer can store in int4 (kzoo.export.litertlm).
        x = self.token_embedding(ops.reshape(token_ids, (-1,)))
        x = ops.reshape(x, (*ops.shape(token_ids), x.shape[-1]))
        # expand_dims, not [..., None]: see `kzoo.layers.masks.merge_masks`.
        x = ops.where(ops.expand_dims(valid, -1), x, float("nan"))
        if self.scale_embeddings:
            x = x * ops.cast(math.sqrt(self.embedding_dim), x.dtype)
        if self.position_embedding is None:
            return x
        positions = self.position_embedding(x, start_index=start_index)
        if self.merge == "add":
            return x + positions
        return ops.concatenate([x, positions], axis=-1)

    def compute_mask(self, token_ids, mask=None):
        if not self.mask_zero:
            return None
        return ops.not_equal(token_ids, 0)

    def compute_output_shape(self, token_ids_shape):
        width = self.embedding_dim * (2 if self.merge == "concat" else 1)
        return (*token_ids_shape, width)

    def get_config(self):
        config = super().get_config()
        config.update(
            vocabulary_size=self.vocabulary_size,
            sequence_length=self.sequence_length,
            embedding_dim=self.embedding_dim,
            position=self.position,
            merge=self.merge,
            mask_zero=self.mask_zero,
            scale_embeddings=self.scale_embeddings,
            embeddings_initializer=keras.initializers.serialize(self.embeddings_initializer),
        )
        return config
