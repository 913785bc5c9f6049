"""Raw strings to a backbone's inputs with a keras-hub tokenizer (TensorFlow ops), and a causal
LM's prompts and replies as Python lists.

One packing serves `Task.preprocess` (and so `predict` on strings) and the text signatures of
`kzoo.export`, so a string gives the same inputs in Python and in a SavedModel. `pack` and
`tokenize` import TensorFlow; the rest does not (generation under JAX runs without it).
"""

import numpy as np

from kzoo.validation import imported_tensorflow
from kzoo.validation import is_text  # noqa: F401  (kzoo.tokenizers.packing.is_text, as before)

# Where a tokenizer has no `<name>_id` attribute (kzoo's WordPiece vocabularies, keras-hub's
# plain WordPieceTokenizer), these tokens name the special ids.
_SPECIAL_TOKENS = {
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "mask_token": "[MASK]",
    "bos_token": "[BOS]",
    "eos_token": "[EOS]",
}


def check_text(x, name):
    """Raises `ValueError` unless `x` (the argument `name`) is a string, or a list / tuple /
    1-D array of strings, each of them Unicode text: a `str` without lone surrogates (what
    UTF-8 can encode), or UTF-8 `bytes`. String tensors pass (they hold bytes).

    Example:
    >>> check_text(["a fine film", 5], "x")
    Traceback (most recent call last):
    ...
    ValueError: `x[1]` is 5 (int), not a string: `x` must be all strings (text) or all token ids.
    """
    tf = imported_tensorflow()
    if tf is not None and isinstance(x, tf.Tensor):
        return
    single = isinstance(x, (str, bytes))
    items = [x] if single else list(np.asarray(x, object).reshape(-1))
    for index, item in enumerate(items):
        where = name if single else f"{name}[{index}]"
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as error:
                raise ValueError(
                    f"`{where}` is not Unicode text: character {error.start} of {_head(item)} is a lone surrogate "
                    f"({item[error.start]!r}), which no encoding of text holds; pass valid text."
                ) from None
        elif isinstance(item, bytes):
            try:
                item.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"`{where}` is not UTF-8 text: byte {error.start} of {_head(item)} cannot be decoded "
                    f"({error.reason}); pass a `str`, or bytes in UTF-8."
                ) from None
        else:
            raise ValueError(
                f"`{where}` is {item!r} ({type(item).__name__}), not a string: `{name}` must be all strings (text) "
                "or all token ids."
            )


def _head(text, limit=40):
    """`text`'s repr, cut to its first `limit` characters (or bytes)."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}..."


def special_token_id(tokenizer, name):
    """The id of the special token `name` ("cls_token", "sep_token", ...) of `tokenizer`."""
    value = getattr(tokenizer, f"{name}_id", None)
    if value is not None:
        return int(value)
    token = _SPECIAL_TOKENS[name]
    try:
        return int(tokenizer.token_to_id(token))
    except (ValueError, KeyError, AttributeError, TypeError) as error:  # TypeError: a character tokenizer
        raise ValueError(f"The {type(tokenizer).__name__} has no {token} token, which these inputs need.") from error


def tokenize(tokenizer, texts):
    """Ragged int32 token ids `(B, None)` of a string tensor `(B,)`."""
    import tensorflow as tf

    token_ids = tokenizer.tokenize(texts)
    if isinstance(token_ids, list):
        token_ids = tf.ragged.constant(token_ids, dtype=tf.int32, ragged_rank=1)
    elif not isinstance(token_ids, tf.RaggedTensor):
        token_ids = tf.RaggedTensor.from_tensor(tf.convert_to_tensor(token_ids), padding=0)
    return tf.cast(token_ids, tf.int32)


def pack(backbone, tokenizer, texts, max_length=None):
    """The inputs of `backbone` for the strings `texts`, padded with 0 to the longest.

    BERT-style backbones (inputs with "segment_ids") get `[CLS] tokens [SEP]` with segment 0;
    others (GPT) the tokens. Rows are cut to `max_length` (default: the backbone's
    `max_sequence_length`) tokens, special ones included.

    Args:
        backbone: a kzoo backbone.
        tokenizer: a keras-hub tokenizer.
        texts: a string, or a list / 1-D tensor of strings.
        max_length: int or None.

    Returns:
        A dict of int32 tensors `(B, T)`.
    """
    import tensorflow as tf

    texts = tf.convert_to_tensor(texts, tf.string)
    texts = tf.reshape(texts, [-1])
    max_length = max_length or backbone.max_sequence_length
    token_ids = tokenize(tokenizer, texts)
    if "segment_ids" in backbone.input:
        column = tf.ones([token_ids.nrows(), 1], tf.int32)
        cls_id, sep_id = special_token_id(tokenizer, "cls_token"), special_token_id(tokenizer, "sep_token")
        token_ids = tf.concat([column * cls_id, token_ids[:, : max_length - 2], column * sep_id], axis=1)
        dense = token_ids.to_tensor()
        mask = tf.ones_like(token_ids).to_tensor()
        return {"token_ids": dense, "segment_ids": tf.zeros_like(dense), "padding_mask": mask}
    token_ids = token_ids[:, :max_length]
    return {"token_ids": token_ids.to_tensor(), "padding_mask": tf.ones_like(token_ids).to_tensor()}


def start_ids(tokenizer):
    """The ids a checkpoint's tokenizer puts before every text (a Llama or Gemma `<bos>`), as a
    list: `[tokenizer.start_token_id]` for a tokenizer that says it adds it (`add_start_token`),
    else none (GPT-2's and kzoo's own tokenizers add nothing)."""
    if getattr(tokenizer, "add_start_token", False) and getattr(tokenizer, "start_token_id", None) is not None:
        return [int(tokenizer.start_token_id)]
    return []


def prompt_ids(tokenizer, text):
    """The token ids of one prompt as the tokenizer's checkpoint encodes it: `start_ids` and the tokens."""
    return start_ids(tokenizer) + [int(token) for token in np.asarray(tokenizer.tokenize(text)).reshape(-1)]


def detokenize(tokenizer, token_ids):
    """The text of one list of token ids, as a Python string."""
    text = tokenizer.detokenize(list(token_ids))
    text = text.numpy() if hasattr(text, "numpy") else text
    return text.decode("utf-8") if isinstance(text, bytes) else str(text)
