"""Boolean attention masks: True means "may attend"."""

from keras import ops

# Kept importable from here (its home before `kzoo._compat`).
from kzoo._compat import keras_mask  # noqa: F401


def causal_mask(query_length, key_length, offset=0, window=None):
    """The look-ahead mask `(query_length, key_length)`, optionally a sliding window.

    Query `i` sits at position `offset + i` and may attend to keys at
    positions `<= offset + i`; with a `window` W, only to the W latest of
    them, positions `> offset + i - W` (the query's own included), as
    Mistral, Qwen and Gemma's sliding-window layers attend. `offset` is the
    cache index during incremental decoding and 0 otherwise.

    Args:
        query_length: int or scalar tensor.
        key_length: int or scalar tensor.
        offset: int or scalar tensor, the position of the first query.
        window: None or an int >= 1, the keys each query sees.

    Example:
    >>> keras.ops.convert_to_numpy(causal_mask(3, 3, window=2)).astype(int).tolist()
    [[1, 0, 0], [1, 1, 0], [0, 1, 1]]
    """
    query_positions = ops.arange(query_length) + offset
    key_positions = ops.arange(key_length)
    mask = ops.greater_equal(query_positions[:, None], key_positions[None, :])
    if window is None:
        return mask
    return ops.logical_and(mask, ops.greater(key_positions[None, :], query_positions[:, None] - window))


def merge_masks(query_mask=None, key_mask=None, attention_mask=None, causal=None):
    """ANDs whichever masks are given into one `(B or 1, T_q, T_k)` mask.

    Args:
        query_mask: `(B, T_q)` padding mask of the queries.
        key_mask: `(B, T_k)` padding mask of the keys.
        attention_mask: mask broadcastable to `(B, T_q, T_k)`.
        causal: `(T_q, T_k)` mask from `causal_mask`.

    Returns:
        A boolean tensor of rank 3, or None when no mask is given.
    """
    mask = None
    for part in (
        # expand_dims, not [:, :, None] / [:, None, :]: the TFLite converter
        # cannot lower such a new axis on a dynamic shape to builtin ops
        # (tensorflow/tensorflow#48018).
        None if query_mask is None else ops.expand_dims(ops.cast(query_mask, "bool"), 2),
        None if key_mask is None else ops.expand_dims(ops.cast(key_mask, "bool"), 1),
        None if attention_mask is None else ops.cast(attention_mask, "bool"),
        causal,
    ):
        if part is not None:
            mask = part if mask is None else ops.logical_and(mask, part)
    if mask is not None and len(mask.shape) == 2:
        mask = mask[None]
    return mask
