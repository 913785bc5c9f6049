"""`CharacterTokenizer`: one id per character, its code point, with an id for every character outside."""

import keras
import keras_hub
import numpy as np
import tensorflow as tf

# ASCII SUB (0x1A, "substitute"): the control character defined to stand in for a character
# that cannot be represented. It never occurs in text, so it is free to be the unknown id.
UNKNOWN_ID = 26
# NUL never occurs in text either; it is the padding id and, in a LiteRT-LM bundle, the stop token.
END_ID = 0


@keras.saving.register_keras_serializable(package="kzoo")
class CharacterTokenizer(keras_hub.tokenizers.UnicodeCodepointTokenizer):
    """A character tokenizer: each character's id is its Unicode code point, below `vocabulary_size`.

    The vocabulary is the characters with code points `0 .. vocabulary_size - 1` (128: ASCII,
    256: Latin-1). Every character outside it, an emoji in an ASCII model say, becomes
    `unknown_id`, by default 26: ASCII SUB, the control character meant to stand in for a
    character that cannot be represented, which never occurs in text. It detokenizes as
    `"\\x1a"`. keras-hub's `UnicodeCodepointTokenizer` would instead clamp such a character to
    the last id (`vocabulary_size - 1`), silently turning it into a real character of the
    vocabulary (`"ÿ"` in Latin-1). Case is kept; id 0 (NUL) is padding and detokenizes to nothing.
    It is also `end_token_id`, the id that ends a generation (a LiteRT-LM bundle's stop token).

    Args:
        vocabulary_size: int, the number of ids, 2 to 0x110000.
        unknown_id: int in `[0, vocabulary_size)`, the id of characters outside the vocabulary.
        **kwargs: `keras_hub.tokenizers.UnicodeCodepointTokenizer` arguments other than
            `vocabulary_size` (e.g. `name`).

    Example:
    >>> tokenizer = CharacterTokenizer(128)
    >>> tokenizer("Hi 😀").tolist()
    [72, 105, 32, 26]
    >>> tokenizer.detokenize([72, 105])
    'Hi'
    """

    end_token_id = END_ID

    def __init__(self, vocabulary_size=128, unknown_id=UNKNOWN_ID, **kwargs):
        if not 2 <= vocabulary_size <= 0x110000:
            raise ValueError(f"`vocabulary_size` must be in [2, {0x110000}]; received {vocabulary_size}.")
        if not 0 <= unknown_id < vocabulary_size:
            raise ValueError(f"`unknown_id` must be in [0, {vocabulary_size - 1}]; received {unknown_id}.")
        kwargs.setdefault("lowercase", False)
        # The parent clamps every code point above the vocabulary to `vocabulary_size`, one past
        # it, which `tokenize` then maps to `unknown_id`.
        super().__init__(vocabulary_size=vocabulary_size + 1, **kwargs)
        self.unknown_id = unknown_id

    def vocabulary_size(self):
        return self._vocabulary_size - 1

    def get_vocabulary(self):
        return {chr(i): i for i in range(self.vocabulary_size())}

    def tokenize(self, inputs):
        return _replace(super().tokenize(inputs), self.vocabulary_size(), self.unknown_id)

    def get_config(self):
        config = super().get_config()
        config.update(vocabulary_size=self.vocabulary_size(), unknown_id=self.unknown_id)
        return config


def _replace(ids, outside, unknown_id):
    """`ids` with every `outside` replaced by `unknown_id`, in whatever form the parent returned."""
    if isinstance(ids, tf.RaggedTensor):
        return tf.ragged.map_flat_values(_replace, ids, outside, unknown_id)
    if isinstance(ids, tf.Tensor):
        return tf.where(ids == outside, tf.cast(unknown_id, ids.dtype), ids)
    if isinstance(ids, np.ndarray):
        return np.where(ids == outside, unknown_id, ids).astype(ids.dtype)
    if isinstance(ids, list):
        return [_replace(value, outside, unknown_id) for value in ids]
    return unknown_id if ids == outside else ids
