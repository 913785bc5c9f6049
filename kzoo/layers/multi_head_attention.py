import contextlib
import contextvars

import keras
import numpy as np
from keras import ops

from kzoo._compat import keras_mask
from kzoo.layers._prototypes import copy_layer
from kzoo.layers._prototypes import deserialize_patterns
from kzoo.layers._prototypes import unbuilt_config
from kzoo.layers.masks import causal_mask
from kzoo.layers.masks import merge_masks
from kzoo.layers.rotary_embedding import RotaryEmbedding
from kzoo.layers.scaled_dot_product_attention import scaled_dot_product_attention
from kzoo.ops.attention import MASKED_SCORE
from kzoo.validation import check_divisible
from kzoo.validation import check_positive_int
from kzoo.validation import check_rate
from kzoo.validation import clone_initializer

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
    >>> mha = MultiHeadAttention(num_heads=2, key_dim=4)
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


@keras.saving.register_keras_serializable(package="kzoo")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention with grouped key/value heads and a KV cache.

    Projects the query into `num_heads` heads and the key and value into
    `num_key_value_heads` heads, runs scaled dot-product attention per head and
    projects the concatenated heads back with W^O. With fewer key/value heads
    than query heads, each key/value head serves a group of
    `num_heads // num_key_value_heads` consecutive query heads (grouped-query
    attention; one key/value head is multi-query attention).

    Masking: the attention mask is the logical AND of the explicit
    `attention_mask` `(B, T_q, T_k)`, the causal mask (`use_causal_mask=True`)
    and the padding masks carried by the inputs (Keras implicit masks, e.g.
    from `Embedding(mask_zero=True)`) or passed as `query_mask`/`value_mask`/
    `key_mask` `(B, T)`. Padded query rows attend to nothing; the output keeps
    the query's mask.

    Between the projections and the attention (and the cache write) the
    queries and keys pass through `transform_query_key`, the one place where
    per-head normalization (`query_key_norm`, QK-norm) and rotary positions
    (`rotary_embedding`) apply; a subclass may override it.

    KV cache: pass `cache`, a pair `(keys, values)` of shapes
    `(B, num_key_value_heads, S, key_dim)` and `(..., value_dim)` (head-major,
    so decoding never transposes it; `empty_cache` makes one). Keys and
    values are separate tensors so that each decode step updates them in
    place (XLA copies a stacked cache on every update). With `cache_index`, the keys/values of the new
    tokens are written at `[cache_index, cache_index + T_q)` and the queries
    attend over the whole cache; with `use_causal_mask=True` query `i` sits at
    position `cache_index + i`, so slots not written yet are never seen. Without
    `cache_index` the cache is used as is (precomputed cross-attention
    keys/values from `compute_cache`). With `sliding_window` W, a causal
    query sees only the W latest positions, in the cache as without it. In
    cache mode the padding masks of
    `value`/`key` do not apply; give `attention_mask` over all `S` slots. The
    call then returns `(output, new_cache)`.

    Args:
        num_heads: int, number of query heads h.
        key_dim: int, size of each query/key head d_k.
        value_dim: int, size of each value head d_v; defaults to `key_dim`.
        num_key_value_heads: int dividing `num_heads`; defaults to `num_heads`.
        dropout: float in [0, 1), dropout on the attention weights.
        use_bias: bool, whether the query, key and value projections have
            biases.
        output_dim: int, size of the output; defaults to the query's width.
        kernel_initializer: initializer of the projection kernels.
        bias_initializer: initializer of the projection biases.
        seed: int, seed of the dropout.
        use_output_bias: bool, whether W^O has a bias; defaults to `use_bias`.
        rotary_embedding: None or a `kzoo.layers.RotaryEmbedding`, applied to
            the queries and keys at their positions (RoPE).
        query_key_norm: None or a normalization layer (e.g.
            `kzoo.layers.RMSNormalization(epsilon=1e-6)`): a copy of it
            normalizes each query head and another each key head over
            `key_dim` (QK-norm, as in Qwen3 and Gemma 3).
        scale: float, the factor on `Q K^T`; defaults to `1 / sqrt(key_dim)`
            (Gemma: `query_pre_attn_scalar ** -0.5`).
        soft_cap: None or a float c: scores become `c * tanh(s / c)`.
        sliding_window: None or an int >= 1: with `use_causal_mask`, each
            query attends to the `sliding_window` latest positions only.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Example:
    >>> x = keras.random.normal((2, 5, 16))
    >>> mha = MultiHeadAttention(num_heads=4, key_dim=4, num_key_value_heads=2)
    >>> tuple(mha(x, use_causal_mask=True).shape)
    (2, 5, 16)
    >>> llama_like = MultiHeadAttention(
    ...     num_heads=4, key_dim=8, num_key_value_heads=1, use_bias=False,
    ...     rotary_embedding=kzoo.layers.RotaryEmbedding(max_wavelength=500000),
    ...     query_key_norm=kzoo.layers.RMSNormalization(epsilon=1e-6), sliding_window=3)
    >>> tuple(llama_like(x, use_causal_mask=True).shape)
    (2, 5, 16)

    References:
        Vaswani et al., "Attention Is All You Need", 2017, sec. 3.2.2.
        Ainslie et al., "GQA", 2023.
        Su et al., "RoFormer", 2021 (rotary positions).
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        num_key_value_heads=None,
        dropout=0.0,
        use_bias=True,
        output_dim=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        seed=None,
        use_output_bias=None,
        rotary_embedding=None,
        query_key_norm=None,
        scale=None,
        soft_cap=None,
        sliding_window=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.key_dim = check_positive_int("key_dim", key_dim)
        self.value_dim = check_positive_int("value_dim", value_dim or key_dim)
        self.num_key_value_heads = check_positive_int("num_key_value_heads", num_key_value_heads or num_heads)
        check_divisible("num_heads", num_heads, "num_key_value_heads", self.num_key_value_heads)
        self.dropout = check_rate("dropout", dropout)
        self.use_bias = bool(use_bias)
        self.use_output_bias = self.use_bias if use_output_bias is None else bool(use_output_bias)
        self.output_dim = None if output_dim is None else check_positive_int("output_dim", output_dim)
        self.rotary_embedding = _layer_argument("rotary_embedding", rotary_embedding, RotaryEmbedding)
        if rotary_embedding is not None and rotary_embedding.sequence_axis not in (1, -3):
            raise ValueError(
                "`rotary_embedding` rotates the queries and keys as `(B, T, heads, head_dim)`: give it "
                f"sequence_axis=1; received sequence_axis={rotary_embedding.sequence_axis}."
            )
        # A prototype: its config, copied for the queries and the keys in `build` (not a sublayer).
        _layer_argument("query_key_norm", query_key_norm, keras.layers.Layer)
        self._query_key_norm = unbuilt_config(query_key_norm)
        self.scale = _positive_or_none("scale", scale)
        self.soft_cap = _positive_or_none("soft_cap", soft_cap)
        self.sliding_window = None if sliding_window is None else check_positive_int("sliding_window", sliding_window)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.supports_masking = True

    def _projection(self, name, heads, head_dim):
        projection = keras.layers.EinsumDense(
            "btd,dhk->bthk",
            output_shape=(None, heads, head_dim),
            bias_axes="hk" if self.use_bias else None,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )
        # A padded input keeps its mask through the projection; attention applies it.
        projection.supports_masking = True
        return projection

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = value_shape or query_shape
        key_shape = key_shape or value_shape
        self.query_dense = self._projection("query", self.num_heads, self.key_dim)
        self.query_dense.build(query_shape)
        self.key_dense = self._projection("key", self.num_key_value_heads, self.key_dim)
        self.key_dense.build(key_shape)
        self.value_dense = self._projection("value", self.num_key_value_heads, self.value_dim)
        self.value_dense.build(value_shape)
        if self._query_key_norm is not None:
            self.query_norm = copy_layer(self._query_key_norm, "query_norm", self.dtype_policy)
            self.query_norm.build((None, None, self.num_heads, self.key_dim))
            self.key_norm = copy_layer(self._query_key_norm, "key_norm", self.dtype_policy)
            self.key_norm.build((None, None, self.num_key_value_heads, self.key_dim))
        self.output_dense = keras.layers.EinsumDense(
            "bthv,hvd->btd",
            output_shape=(None, self.output_dim or query_shape[-1]),
            bias_axes="d" if self.use_output_bias else None,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name="attention_output",
        )
        self.output_dense.build((None, None, self.num_heads, self.value_dim))
        self.built = True

    def empty_cache(self, batch_size, max_length, dtype=None):
        """A zero KV cache: `(keys, values)`, each `(batch_size, num_key_value_heads, max_length, dim)`."""
        dtype = dtype or self.compute_dtype
        return (
            ops.zeros((batch_size, self.num_key_value_heads, max_length, self.key_dim), dtype=dtype),
            ops.zeros((batch_size, self.num_key_value_heads, max_length, self.value_dim), dtype=dtype),
        )

    def _project(self, x, *denses):
        """`(B, T, d)` -> one `(B, T, heads, head_dim)` per dense.

        Each dense is called, except for one token (a decoding step) through
        float kernels: there the projections run side by side, as one
        `(d, sum heads * head_dim)` matrix-vector product instead of one
        small product each. It reads each kernel as the dense's own call
        does (`kernel` includes a LoRA update); quantized kernels are only
        read by their dense's call, so those are always called.
        """
        side_by_side = x.shape[1] == 1 and len(denses) > 1 and all(d.quantization_mode is None for d in denses)
        if not side_by_side:
            return [dense(x) for dense in denses]
        kernels = [ops.cast(dense.kernel, self.compute_dtype) for dense in denses]  # (d, heads, head_dim) each
        y = ops.matmul(x, ops.concatenate([ops.reshape(kernel, (kernel.shape[0], -1)) for kernel in kernels], axis=1))
        if self.use_bias:
            y = y + ops.concatenate([ops.reshape(ops.cast(dense.bias, self.compute_dtype), (-1,)) for dense in denses])
        sizes = [kernel.shape[1] * kernel.shape[2] for kernel in kernels]
        parts = ops.split(y, np.cumsum(sizes)[:-1].tolist(), axis=-1)
        return [ops.reshape(part, (ops.shape(x)[0], 1, *kernel.shape[1:])) for part, kernel in zip(parts, kernels)]

    def transform_query_key(self, query, key, start_index):
        """The queries and keys between the projections and the attention; users can override this.

        Applies `query_key_norm` (a copy per side, over each head) and then
        `rotary_embedding` at positions `start_index, start_index + 1, ...`.

        Args:
            query: `(B, T_q, num_heads, key_dim)`, or None (`compute_cache`).
            key: `(B, T_k, num_key_value_heads, key_dim)`, or None where the
                keys come from a precomputed cache.
            start_index: int or scalar int tensor, the position of the first
                query (and key).

        Returns:
            `(query, key)`, of the same shapes.
        """
        norms = (self.query_norm, self.key_norm) if self._query_key_norm is not None else (None, None)
        results = []
        for x, norm in zip((query, key), norms):
            if x is not None and norm is not None:
                x = norm(x)
            if x is not None and self.rotary_embedding is not None:
                x = self.rotary_embedding(x, start_index=start_index)
            results.append(x)
        return tuple(results)

    def compute_cache(self, value, key=None):
        """Projects `key`/`value` once into a `(keys, values)` cache for cross-attention."""
        if key is None or key is value:
            k, v = self._project(value, self.key_dense, self.value_dense)
        else:
            (k,), (v,) = self._project(key, self.key_dense), self._project(value, self.value_dense)
        _, k = self.transform_query_key(None, k, 0)
        return _head_major(k), _head_major(v)

    def _check_cache(self, cache, query, cache_index):
        expected = [
            (query.shape[0], self.num_key_value_heads, None, self.key_dim),
            (query.shape[0], self.num_key_value_heads, None, self.value_dim),
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
                f"{query.shape[0]}, num_key_value_heads={self.num_key_value_heads}, max_length, "
                f"key_dim={self.key_dim}) and (..., value_dim={self.value_dim}); received {received}."
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

    def call(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        cache=None,
        cache_index=None,
        training=None,
    ):
        if query_mask is None:
            query_mask = keras_mask(query)
        if value is None:
            value, value_mask = query, query_mask
        elif value_mask is None:
            value_mask = keras_mask(value)
        if key is None:
            key, key_mask = value, value_mask
        elif key_mask is None:
            key_mask = keras_mask(key)

        if cache is not None:
            self._check_cache(cache, query, cache_index)
        start_index = 0 if cache_index is None else cache_index
        if cache is not None and cache_index is None:  # precomputed keys/values
            (q,) = self._project(query, self.query_dense)
            q, _ = self.transform_query_key(q, None, start_index)
            q, (k, v) = _head_major(q), cache
        else:
            if key is value and value is query:  # self-attention: one matmul
                q, k, v = self._project(query, self.query_dense, self.key_dense, self.value_dense)
            elif key is value:
                (q,) = self._project(query, self.query_dense)
                k, v = self._project(value, self.key_dense, self.value_dense)
            else:
                (q,) = self._project(query, self.query_dense)
                (k,) = self._project(key, self.key_dense)
                (v,) = self._project(value, self.value_dense)
            q, k = self.transform_query_key(q, k, start_index)
            q, k, v = _head_major(q), _head_major(k), _head_major(v)
        # q: (B, h, T_q, d_k); k/v: (B, h_kv, T_k, d)
        if cache is None:
            key_padding = value_mask if key_mask is None else key_mask
            key_offset = 0
        else:
            if cache_index is not None:
                start = (0, 0, cache_index, 0)
                k = ops.slice_update(cache[0], start, ops.cast(k, cache[0].dtype))
                v = ops.slice_update(cache[1], start, ops.cast(v, cache[1].dtype))
                cache = (k, v)
            key_padding = None
            key_offset = 0 if cache_index is None else cache_index

        # The mask over every key, made once: a span's branch only slices it (an op inside a
        # branch costs LiteRT more than outside one).
        mask = merge_masks(
            query_mask=query_mask,
            key_mask=key_padding,
            attention_mask=attention_mask,
            causal=causal_mask(ops.shape(q)[2], ops.shape(k)[2], key_offset, self.sliding_window)
            if use_causal_mask
            else None,
        )
        bias = None
        if use_causal_mask and mask is not None and self._keyed(query_mask, key_padding, attention_mask, cache_index):
            # As an additive bias, the same weights: float adds, which LiteRT's XNNPack runs,
            # where the boolean select falls to slower kernels; and no zeroing of key-less rows,
            # which a causal mask alone never leaves.
            bias, mask = self._grouped(ops.where(mask, 0.0, MASKED_SCORE), ops.shape(q)[2]), None

        def attend(length):
            if length is None or length == k.shape[2]:  # a slice of all of it would still copy it
                return self._attend(q, k, v, mask, bias, training, return_attention_scores)
            keys, values = k[:, :, :length], v[:, :, :length]
            return self._attend(q, keys, values, _first(mask, length), _first(bias, length), training)

        context = _CACHE_SPANS.get()
        cache_length = k.shape[2]
        if (
            context is not None
            and cache_index is not None
            and cache is not None
            and use_causal_mask
            and attention_mask is None
            and not return_attention_scores
            and cache_length is not None
        ):
            spans, max_queries = context
            window = self._window_length(q.shape[2] or max_queries, cache_length)
            if window is None:
                last = (cache_length, attend)
            else:  # a sliding layer: its window, which every span as long or longer holds too
                last = (window, lambda length: self._attend_window(q, k, v, mask, bias, cache_index, length, training))
            output, scores = _attend_first(cache_index + ops.shape(q)[2], spans, *last, attend), None
        else:
            output, scores = attend(None)
        output = self._output(output)  # (B, T_q, d)

        results = (output,)
        if return_attention_scores:
            results += (scores,)
        if cache is not None:
            results += (cache,)
        return results[0] if len(results) == 1 else results

    def _output(self, heads):
        """W^O on `(B, T_q, h, d_v)`. A single row (one sequence decoding one token) goes in
        beside a zero row: XLA's CPU compiler fuses a one-row product whose kernel it must
        reshape (this `(h, d_v, d)` one) into a naive loop, several times slower than the
        matrix-vector kernel a two-row product gets; the kernel is read once either way."""
        if heads.shape[0] == 1 and heads.shape[1] == 1 and _PAD_ONE_ROW.get():
            return self.output_dense(ops.concatenate([heads, ops.zeros_like(heads)], axis=1))[:, :1]
        return self.output_dense(heads)

    def _attend(self, q, k, v, mask, bias, training, return_scores=False):
        """Grouped attention: q `(B, h, T_q, d_k)`, k/v `(B, h_kv, T_k, d)`.

        The `g = h / h_kv` query heads of a group are stacked along the query
        axis, `(B, h_kv, g * T_q, d_k)`, so one plain batched matmul per
        key/value head serves the whole group (a free reshape, no copy).
        """
        batch, length = ops.shape(q)[0], ops.shape(q)[2]
        groups = self.num_heads // self.num_key_value_heads
        q = ops.reshape(q, (batch, self.num_key_value_heads, groups * length, self.key_dim))
        output = scaled_dot_product_attention(
            q,
            k,
            v,
            mask=None if mask is None else self._grouped(mask, length),
            bias=bias,
            scale=self.scale,
            soft_cap=self.soft_cap,
            dropout_rate=self.dropout,
            training=training,
            # Without the weights, a training step neither keeps them beside
            # the dropped ones nor back-propagates zeros through them.
            return_scores=return_scores,
            seed=self.seed_generator,
        )  # (B, h_kv, g * T_q, d_v), and (B, h_kv, g * T_q, T_k) if return_scores
        output, scores = output if return_scores else (output, None)
        output = ops.reshape(output, (batch, self.num_heads, length, self.value_dim))
        output = ops.transpose(output, (0, 2, 1, 3))  # (B, T_q, h, d_v)
        if scores is not None:
            scores = ops.reshape(scores, (batch, self.num_heads, length, ops.shape(k)[2]))
        return output, scores

    def _window_length(self, queries, cache_length):
        """The slots a sliding-window call of `queries` (int or None) queries reads, None for the
        whole cache: the W latest positions of its first query through its last."""
        if self.sliding_window is None or queries is None:
            return None
        length = self.sliding_window + queries - 1
        return length if length < cache_length else None

    def _attend_window(self, q, k, v, mask, bias, cache_index, length, training):
        """Attention over the `length` cache slots that end at the last query's position (from
        slot 0 while the cache holds fewer), the mask or bias cut to the same keys."""
        start = ops.clip(cache_index + ops.shape(q)[2] - length, 0, k.shape[2] - length)
        keys, values = (_cut(x, 2, start, length) for x in (k, v))
        mask, bias = (None if x is None else _cut(x, len(x.shape) - 1, start, length) for x in (mask, bias))
        return self._attend(q, keys, values, mask, bias, training)

    def _grouped(self, mask, length):
        """A `(B, T_q, T_k)` mask as `(B, 1, g * T_q, T_k)`, each query's row repeated for the
        `g` query heads of a key/value group (`_attend` stacks them so); a mask with one row
        for every query only gains the head axis."""
        mask = ops.expand_dims(mask, 1)  # (B, 1, T_q, T_k); `[:, None]` would be a strided slice in TFLite
        groups = self.num_heads // self.num_key_value_heads
        if groups == 1 or mask.shape[2] == 1:
            return mask
        batch, key_length = ops.shape(mask)[0], ops.shape(mask)[3]
        stacked = ops.broadcast_to(ops.expand_dims(mask, 2), (batch, 1, groups, length, key_length))
        return ops.reshape(stacked, (batch, 1, groups * length, key_length))

    def _keyed(self, query_mask, key_padding, attention_mask, cache_index):
        """Whether a causal mask alone decides what each query sees, leaving each its own
        position (in the cache; without a window, key 0 too)."""
        alone = query_mask is None and key_padding is None and attention_mask is None
        return alone and (self.sliding_window is None or cache_index is not None)

    def compute_mask(self, query, previous_mask=None):
        return previous_mask

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        return (*query_shape[:-1], self.output_dim or query_shape[-1])

    def compute_output_spec(
        self,
        query,
        value=None,
        key=None,
        return_attention_scores=False,
        cache=None,
        **kwargs,
    ):
        output = keras.KerasTensor(self.compute_output_shape(query.shape), dtype=self.compute_dtype)
        results = (output,)
        if return_attention_scores:
            if cache is not None:
                key_length = cache[0].shape[2]
            else:
                key_length = (key if key is not None else value if value is not None else query).shape[1]
            results += (
                keras.KerasTensor(
                    (query.shape[0], self.num_heads, query.shape[1], key_length),
                    dtype=self.compute_dtype,
                ),
            )
        if cache is not None:
            results += (tuple(keras.KerasTensor(part.shape, dtype=part.dtype) for part in cache),)
        return results[0] if len(results) == 1 else results

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            key_dim=self.key_dim,
            value_dim=self.value_dim,
            num_key_value_heads=self.num_key_value_heads,
            dropout=self.dropout,
            use_bias=self.use_bias,
            output_dim=self.output_dim,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
            seed=self.seed,
            use_output_bias=self.use_output_bias,
            rotary_embedding=None if self.rotary_embedding is None else keras.layers.serialize(self.rotary_embedding),
            query_key_norm=self._query_key_norm,
            scale=self.scale,
            soft_cap=self.soft_cap,
            sliding_window=self.sliding_window,
        )
        return config

    @classmethod
    def from_config(cls, config):
        return super().from_config(deserialize_patterns(config, ("rotary_embedding", "query_key_norm")))


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


def _head_major(x):
    """`(B, T, heads, head_dim)` -> `(B, heads, T, head_dim)`."""
    return ops.transpose(x, (0, 2, 1, 3))


def _positive_or_none(name, value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"`{name}` must be None or a number > 0; received {name}={value!r}.")
    return float(value)


def _layer_argument(name, value, cls):
    if value is not None and not isinstance(value, cls):
        raise ValueError(f"`{name}` must be None or a {cls.__name__} instance; received {type(value).__name__}.")
    return value
