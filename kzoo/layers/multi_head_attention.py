import keras
import numpy as np
from keras import ops

from kzoo._compat import keras_mask
from kzoo.layers import kv_cache
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


class MaskAndBias:
    """What a `MultiHeadAttention` call attends with, from `compute_mask_and_bias`: a boolean
    mask or an additive float32 bias (either may be None).

    An object of its own rather than a tuple, because `Layer.__call__` casts the floating
    tensors among a call's arguments, nested ones too, to the layer's compute dtype (bfloat16
    under "mixed_bfloat16"), where the bias must stay float32; other objects it passes as
    they are.

    Attributes:
        mask: None or a boolean tensor `(B or 1, 1, g * T_q, T_k)`.
        bias: None or a float32 tensor of that shape.
    """

    __slots__ = ("mask", "bias")

    def __init__(self, mask, bias):
        self.mask, self.bias = mask, bias


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

    Shared positions and masks: layers whose calls see the same positions and
    masks (a decoder's blocks) compute them once and pass them in, `rotation`
    from `rotary_embedding.rotation` and `mask_and_bias` from
    `compute_mask_and_bias`; a call given them computes neither, and its
    outputs are the same.

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

    def transform_query_key(self, query, key, start_index, rotation=None):
        """The queries and keys between the projections and the attention; users can override this.

        Applies `query_key_norm` (a copy per side, over each head) and then
        `rotary_embedding` at positions `start_index, start_index + 1, ...`
        (its `rotation` there, where given).

        Args:
            query: `(B, T_q, num_heads, key_dim)`, or None (`compute_cache`).
            key: `(B, T_k, num_key_value_heads, key_dim)`, or None where the
                keys come from a precomputed cache.
            start_index: int or scalar int tensor, the position of the first
                query (and key).
            rotation: None, or the `Rotation` of `rotary_embedding.rotation` at
                these positions, for queries and keys `(B, T, heads, key_dim)`
                (passed only where the call was given one).

        Returns:
            `(query, key)`, of the same shapes.
        """
        norms = (self.query_norm, self.key_norm) if self._query_key_norm is not None else (None, None)
        results = []
        for x, norm in zip((query, key), norms):
            if x is not None and norm is not None:
                x = norm(x)
            if x is not None and self.rotary_embedding is not None:
                x = self.rotary_embedding(x, start_index=start_index, rotation=rotation)
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
        rotation=None,
        mask_and_bias=None,
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
            kv_cache.check(cache, query, cache_index, self.num_key_value_heads, self.key_dim, self.value_dim)
        start_index = 0 if cache_index is None else cache_index
        # Passed only where given, so that an override of `transform_query_key` without it still serves other calls.
        rotate = {} if rotation is None else {"rotation": rotation}
        if cache is not None and cache_index is None:  # precomputed keys/values
            (q,) = self._project(query, self.query_dense)
            q, _ = self.transform_query_key(q, None, start_index, **rotate)
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
            q, k = self.transform_query_key(q, k, start_index, **rotate)
            q, k, v = _head_major(q), _head_major(k), _head_major(v)
        # q: (B, h, T_q, d_k); k/v: (B, h_kv, T_k, d)
        if cache is not None and cache_index is not None:
            cache = kv_cache.write(cache, k, v, cache_index)
            k, v = cache
        # The mask over every key, made once: a span's branch only slices it (an op inside a
        # branch costs LiteRT more than outside one).
        if mask_and_bias is None:
            mask_and_bias = self.compute_mask_and_bias(
                ops.shape(q)[2],
                ops.shape(k)[2],
                query_mask=query_mask,
                key_mask=value_mask if key_mask is None else key_mask,
                attention_mask=attention_mask,
                use_causal_mask=use_causal_mask,
                cache_index=cache_index,
                cached=cache is not None,
            )
        mask, bias = mask_and_bias.mask, mask_and_bias.bias

        # Inside `kv_cache.cache_spans`, a causal step over the cache reads only the slots its queries see.
        spans = kv_cache.current_spans()
        if (
            spans is not None
            and cache_index is not None
            and cache is not None
            and use_causal_mask
            and attention_mask is None
            and not return_attention_scores
            and k.shape[2] is not None
        ):

            def attend(keys, values, cut_mask, cut_bias):
                return self._attend(q, keys, values, cut_mask, cut_bias, training)

            output = kv_cache.attend_within_spans(attend, q, k, v, mask, bias, cache_index, self.sliding_window, *spans)
            scores = None
        else:
            output, scores = self._attend(q, k, v, mask, bias, training, return_attention_scores)
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
        reshape (this `(h, d_v, d)` one) into a naive loop, slower than the
        matrix-vector kernel a two-row product gets; the kernel is read once either way."""
        if heads.shape[0] == 1 and heads.shape[1] == 1 and kv_cache.pads_one_row():
            return self.output_dense(ops.concatenate([heads, ops.zeros_like(heads)], axis=1))[:, :1]
        return self.output_dense(heads)

    def _attend(self, q, k, v, mask, bias, training, return_scores=False):
        """Grouped attention: q `(B, h, T_q, d_k)`, k/v `(B, h_kv, T_k, d)`.

        The `g = h / h_kv` query heads of a group are stacked along the query
        axis, `(B, h_kv, g * T_q, d_k)`, so one plain batched matmul per
        key/value head serves the whole group (a free reshape, no copy); `mask`
        and `bias` are stacked so (`compute_mask_and_bias`).
        """
        batch, length = ops.shape(q)[0], ops.shape(q)[2]
        groups = self.num_heads // self.num_key_value_heads
        q = ops.reshape(q, (batch, self.num_key_value_heads, groups * length, self.key_dim))
        output = scaled_dot_product_attention(
            q,
            k,
            v,
            mask=mask,
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

    def compute_mask_and_bias(
        self,
        query_length,
        key_length,
        query_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        cache_index=None,
        cached=False,
    ):
        """What a call with these masks attends with: a boolean mask or an additive bias.

        A call computes it from its own masks (see the class docstring); a stack of layers
        whose calls share their masks computes it once and passes it to every call
        (`call(..., mask_and_bias=...)`), which then ignores its mask arguments. Both
        forms have one row per query of each key/value head's group of query heads.

        Args:
            query_length: int or scalar int tensor, the queries T_q.
            key_length: int or scalar int tensor, the keys T_k (the cache's
                slots with a cache).
            query_mask: None or `(B, T_q)`, the queries' padding mask.
            key_mask: None or `(B, T_k)`, the keys' padding mask (not read
                with a cache).
            attention_mask: None or a mask broadcastable to `(B, T_q, T_k)`.
            use_causal_mask: bool, as in `call`.
            cache_index: None or int or scalar int tensor, as in `call`.
            cached: bool, whether the keys are a KV cache (`call`'s `cache`).

        Returns:
            A `MaskAndBias`: a boolean `(B or 1, 1, g * T_q, T_k)` mask, or a
            float32 bias of that shape (0 where a causal mask alone lets a query
            see a key, `MASKED_SCORE` elsewhere), or neither where nothing is
            masked.
        """
        key_padding = None if cached else key_mask
        key_offset = 0 if cache_index is None or not cached else cache_index
        mask = merge_masks(
            query_mask=query_mask,
            key_mask=key_padding,
            attention_mask=attention_mask,
            causal=causal_mask(query_length, key_length, key_offset, self.sliding_window) if use_causal_mask else None,
        )
        if mask is None:
            return MaskAndBias(None, None)
        if use_causal_mask and self._keyed(query_mask, key_padding, attention_mask, cache_index):
            # As an additive bias, the same weights: float adds, which LiteRT's XNNPack runs,
            # where the boolean select falls to slower kernels; and no zeroing of key-less rows,
            # which a causal mask alone never leaves.
            return MaskAndBias(None, self._grouped(ops.where(mask, 0.0, MASKED_SCORE), query_length))
        return MaskAndBias(self._grouped(mask, query_length), None)

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
