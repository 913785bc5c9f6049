"""The KV cache of `MultiHeadAttention`: its checks and writes, and the cache spans and window
slices that let a compiled or exported step read only the slots it needs.

A cache is the pair `(keys, values)` that `MultiHeadAttention` documents, head-major
`(B, num_key_value_heads, S, head_dim)`.
"""

import contextlib
import contextvars

from keras import ops

from kzoo.validation import check_positive_int

_CACHE_SPANS = contextvars.ContextVar("kzoo_cache_spans", default=None)  # (lengths, max_queries)
# Whether a one-row output projection gets a zero row beside it (see `MultiHeadAttention._output`).
_PAD_ONE_ROW = contextvars.ContextVar("kzoo_pad_one_row", default=True)


@contextlib.contextmanager
def one_row_as_is():
    """Traces the one-row output projection as it is: for LiteRT, where the padding row
    `MultiHeadAttention._output` adds for XLA would be two ops more per layer."""
    token = _PAD_ONE_ROW.set(False)
    try:
        yield
    finally:
        _PAD_ONE_ROW.reset(token)


def pads_one_row():
    """Whether a one-row output projection is traced beside a zero row (outside `one_row_as_is`)."""
    return _PAD_ONE_ROW.get()


@contextlib.contextmanager
def cache_spans(lengths, max_queries=None):
    """Within it, cached causal attention reads only the slots of the cache that it needs.

    A KV cache is as long as the longest sequence served, and attention over all of it (the
    unwritten slots masked) costs every step in proportion to that length. Inside this
    context, a `MultiHeadAttention` call with `cache`, `cache_index` and `use_causal_mask`
    attends over the first `n` slots only, for the smallest `n` of `lengths` that holds
    positions `[0, cache_index + T_q)` (else the whole cache): one static-shape branch per
    length, chosen at run time by `keras.ops.cond`, so a compiled or exported step (XLA, a
    TFLite `IF`) skips the slots the position has not reached. A layer with a
    `sliding_window` W reads, past the spans shorter than its window, only the
    `W + T_q - 1` slots that end at its last position (a static-length slice at a run-time
    offset), when `T_q` is known while tracing or bounded by `max_queries`. The outputs are
    those of the whole cache: the slots left out are masked either way. Calls with an
    explicit `attention_mask` or `return_attention_scores` read the whole cache. The context
    applies while a model is called or traced, and is not saved with it.

    Args:
        lengths: ints >= 1, e.g. `(256, 512, 1024)`; lengths not shorter than a cache are ignored.
        max_queries: None or an int >= 1, the most queries of a call whose query length is
            unknown while tracing (a decode step traced for any length, run with one).

    Example:
    >>> mha = kzoo.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    >>> x = keras.ops.ones((1, 1, 8))
    >>> cache = mha.empty_cache(1, 64)
    >>> with cache_spans((16, 32)):
    ...     y, cache = mha(x, use_causal_mask=True, cache=cache, cache_index=3)
    >>> tuple(y.shape)
    (1, 1, 8)
    """
    lengths = tuple(sorted({check_positive_int("lengths", n) for n in lengths}))
    if max_queries is not None:
        check_positive_int("max_queries", max_queries)
    token = _CACHE_SPANS.set((lengths, max_queries))
    try:
        yield
    finally:
        _CACHE_SPANS.reset(token)


def current_spans():
    """`(lengths, max_queries)` of the enclosing `cache_spans`, or None outside one."""
    return _CACHE_SPANS.get()


def check(cache, query, cache_index, num_key_value_heads, key_dim, value_dim):
    """Raises ValueError unless `cache` is a pair `(keys, values)` for `query` `(B, T_q, d)` and
    `T_q` new tokens fit at `cache_index` (where both are known while tracing)."""
    expected = [
        (query.shape[0], num_key_value_heads, None, key_dim),
        (query.shape[0], num_key_value_heads, None, value_dim),
    ]
    shapes = [tuple(part.shape) for part in cache] if isinstance(cache, (tuple, list)) else None
    ok = (
        shapes is not None
        and len(shapes) == 2
        and shapes[0][:3] == shapes[1][:3]
        and all(
            len(shape) == 4 and all(e is None or d is None or d == e for d, e in zip(shape, want))
            for shape, want in zip(shapes, expected)
        )
    )
    if not ok:
        received = shapes if shapes is not None else getattr(cache, "shape", type(cache).__name__)
        raise ValueError(
            "`cache` must be a pair (keys, values) of shapes (batch_size="
            f"{query.shape[0]}, num_key_value_heads={num_key_value_heads}, max_length, "
            f"key_dim={key_dim}) and (..., value_dim={value_dim}); received {received}."
        )
    max_length, length = shapes[0][2], query.shape[1]
    if (
        isinstance(cache_index, int)
        and max_length is not None
        and length is not None
        and not 0 <= cache_index <= max_length - length
    ):
        raise ValueError(
            f"`cache_index` must be in [0, {max_length - length}] so that "
            f"{length} new tokens fit in a cache of length {max_length}; "
            f"received cache_index={cache_index}."
        )


def write(cache, keys, values, cache_index):
    """`cache` with `keys` and `values` `(B, h_kv, T, d)` written at slots `[cache_index, cache_index + T)`."""
    start = (0, 0, cache_index, 0)
    return (
        ops.slice_update(cache[0], start, ops.cast(keys, cache[0].dtype)),
        ops.slice_update(cache[1], start, ops.cast(values, cache[1].dtype)),
    )


def attend_within_spans(attend, q, k, v, mask, bias, cache_index, sliding_window, spans, max_queries):
    """`attend`'s output over the fewest cache slots that hold every position the queries see
    (`cache_spans`).

    Args:
        attend: `attend(keys, values, mask, bias)` -> `(output, scores)`, attention of the
            queries over the keys and values given, the mask or bias cut to the same keys.
        q: `(B, h, T_q, d_k)`, the queries (read for their number).
        k, v: `(B, h_kv, S, d)`, the whole cache, `S` known while tracing.
        mask, bias: the mask and the additive bias over all `S` keys (either may be None).
        cache_index: int or scalar int tensor, the position of the first query.
        sliding_window: None or the layer's window.
        spans, max_queries: those of `cache_spans`.
    """
    cache_length = k.shape[2]

    def first(length):  # the first `length` slots
        if length == cache_length:  # a slice of all of it would still copy it
            return attend(k, v, mask, bias)
        return attend(k[:, :, :length], v[:, :, :length], _first(mask, length), _first(bias, length))

    def window(length):  # the `length` slots that end at the last query's position
        start = ops.clip(cache_index + ops.shape(q)[2] - length, 0, cache_length - length)
        keys, values = (_cut(x, 2, start, length) for x in (k, v))
        cut_mask, cut_bias = (None if x is None else _cut(x, len(x.shape) - 1, start, length) for x in (mask, bias))
        return attend(keys, values, cut_mask, cut_bias)

    window_length = _window_length(sliding_window, q.shape[2] or max_queries, cache_length)
    if window_length is None:
        last = (cache_length, first)
    else:  # a sliding layer: its window, which every span as long or longer holds too
        last = (window_length, window)
    return _attend_first(cache_index + ops.shape(q)[2], spans, *last, first)


def _window_length(sliding_window, queries, cache_length):
    """The slots a sliding-window call of `queries` (int or None) queries reads, None for the
    whole cache: the W latest positions of its first query through its last (from slot 0
    while the cache holds fewer)."""
    if sliding_window is None or queries is None:
        return None
    length = sliding_window + queries - 1
    return length if length < cache_length else None


def _attend_first(filled, spans, last, attend_last, attend):
    """`attend(n)[0]` for the smallest `n` of `spans` shorter than `last` with `filled <= n`,
    else `attend_last(last)[0]`.

    The branches nest from the largest span down: the last branch, where attention costs the
    most, sits behind one `IF`, and the further ones cost least where the spans are short.
    """
    branches = [(n, attend) for n in spans if n < last] + [(last, attend_last)]
    if isinstance(filled, int):  # known now: no branches
        n, branch = next(((n, f) for n, f in branches[:-1] if filled <= n), branches[-1])
        return branch(n)[0]

    def within(branches):  # the first of `branches` whose length holds `filled`, else the last
        *shorter, (n, branch) = branches
        if not shorter:
            return branch(n)[0]
        return ops.cond(filled <= shorter[-1][0], lambda: within(shorter), lambda: branch(n)[0])

    return within(branches)


def _cut(x, axis, start, length):
    """`x[..., start : start + length, ...]` along `axis`, `start` known at run time only."""
    shape = [ops.shape(x)[i] if size is None else size for i, size in enumerate(x.shape)]
    shape[axis] = length
    return ops.slice(x, [start if i == axis else 0 for i in range(len(shape))], shape)


def _first(mask, length):
    """The first `length` keys of a mask or bias (None stays None)."""
    return None if mask is None else mask[..., :length]
