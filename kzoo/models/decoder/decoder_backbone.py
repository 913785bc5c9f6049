import keras
from keras import ops

from kzoo._compat import keras_mask
from kzoo.layers import FeedForward
from kzoo.layers import GatedFeedForward
from kzoo.layers import LayerNormalization
from kzoo.layers import MultiHeadAttention
from kzoo.layers import RMSNormalization
from kzoo.layers import RotaryEmbedding
from kzoo.layers import TokenAndPositionEmbedding
from kzoo.layers import TransformerDecoderBlock
from kzoo.layers.rotary_embedding import check_rope_scaling
from kzoo.models.backbone import Backbone
from kzoo.validation import check_choice
from kzoo.validation import check_divisible
from kzoo.validation import check_positive_int
from kzoo.validation import check_rate

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
LAYER_TYPES = (FULL_ATTENTION, SLIDING_ATTENTION)


def decoder_initializer():
    """GPT-2 and the Llama lineage initialize every weight matrix from N(0, 0.02^2)."""
    return keras.initializers.RandomNormal(stddev=0.02)


@keras.saving.register_keras_serializable(package="kzoo")
class DecoderBackbone(Backbone):
    """A decoder-only transformer, GPT-2 to the Llama lineage, without the language-model head.

    One backbone for the causal decoders of the last years, each a setting of
    its config (see `kzoo.models.list_presets("CausalLM")` and the Hugging
    Face families of `kzoo.models.decoder.decoder_hf`):

        h_0 = scale * W_e[x]  (+ W_p with learned positions)
        h_l = TransformerDecoderBlock(h_{l-1})    (causal, pre-norm)
        output = Norm(h_L)

    - GPT-2: learned positions, LayerNorm, tanh-GELU feed-forward, biases.
    - Llama, SmolLM, Mistral, Qwen2, Qwen3: rotary positions (with Llama 3's
      frequency scaling), RMSNorm, SwiGLU, grouped key/value heads, optional
      query/key/value biases (Qwen2), QK-norm (Qwen3), sliding windows.
    - Gemma, Gemma 3: GeGLU, embeddings scaled by sqrt(d), RMSNorm with
      `1 + w`, four norms per block, a query scale of its own, sliding layers
      with their own RoPE base.

    Position t attends to positions <= t only (and, in a sliding-window
    layer, to the `sliding_window` latest of them). Padding: `padding_mask`
    (1 = real token) keeps padded keys out of every attention; padded
    positions get outputs with no meaning, so losses must weight them 0.

    `decode` is the forward pass: the functional model is built from it, and
    it also runs incrementally against one KV cache per block
    (`empty_cache`), which `CausalLM.prefill` / `decode` use.

    Inputs: `{"token_ids": (B, T) int, "padding_mask": (B, T) int}`, with
    T <= `max_sequence_length`. Output: the hidden states `(B, T, hidden_dim)`.

    Args:
        vocabulary_size: int, number of token ids V.
        num_layers: int, number of blocks L.
        num_heads: int, query heads per block.
        hidden_dim: int, model width d.
        intermediate_dim: int, feed-forward hidden width.
        max_sequence_length: int, the longest sequence (the position table's
            size with learned positions, the context the model was trained
            for with rotary ones).
        num_key_value_heads: int dividing `num_heads` (grouped-query
            attention); defaults to `num_heads`.
        head_dim: int, size of each head; defaults to `hidden_dim // num_heads`.
        positions: "rotary" (RoPE on queries and keys) or "learned" (a table
            added to the token vectors).
        rope_parameters: the rotary settings, as transformers' config field of
            that name: `{"rope_theta": base, "rope_type": "default" | "linear"
            | "llama3", its fields (`factor`, ...), "partial_rotary_factor": f}`,
            or one such dict per layer type (`{"full_attention": {...},
            "sliding_attention": {...}}`, Gemma 3). Defaults to base 10000.
        normalization: "rms_norm" or "layer_norm".
        norm_epsilon: float > 0, epsilon of every norm.
        norm_unit_offset: bool, RMSNorm scales by `1 + w` (Gemma).
        feed_forward: "gated" (`act(W_gate x) * W_up x`) or "plain".
        activation: the feed-forward activation ("silu", "gelu_approximate", ...).
        attention_bias: bool, biases on the query, key and value projections.
        attention_output_bias: bool, a bias on the attention output
            projection; defaults to `attention_bias`.
        feed_forward_bias: bool, biases in the feed-forward network.
        query_key_norm: bool, RMSNorm over each query and key head (QK-norm).
        attention_scale: float, the factor on `Q K^T`; defaults to
            `head_dim ** -0.5`.
        attention_soft_cap: None or a float, attention-logit soft-capping.
        final_logit_soft_cap: None or a float, soft-capping of the LM head's
            logits (read by `CausalLM`).
        layer_types: None or a list of L entries, "full_attention" or
            "sliding_attention"; None is all sliding with a `sliding_window`,
            else all full.
        sliding_window: None or an int, the keys a sliding layer's queries see.
        rope_layers: None (every layer) or a list of L bools, the layers whose
            attention applies RoPE; the others have no positions of their own
            (SmolLM3's NoPE layers).
        sandwich_norm: bool, also normalize each sublayer's output (Gemma 2/3).
        scale_embeddings: bool, multiply the token vectors by sqrt(d) (Gemma).
        tie_embeddings: bool, the LM head is the token table (read by `CausalLM`).
        dropout: float in [0, 1), on embeddings, attention weights and residuals.
        model_type: None or the Hugging Face `model_type` this config is (set
            by the loaders; `export_to_transformers` writes it back).
        dtype: None or a dtype policy for every layer.
        **kwargs: `keras.Model` arguments (`name`, `trainable`).

    Example:
    >>> backbone = DecoderBackbone(
    ...     vocabulary_size=1000, num_layers=2, num_heads=4, num_key_value_heads=2,
    ...     hidden_dim=64, intermediate_dim=128, max_sequence_length=256,
    ... )
    >>> tuple(backbone({"token_ids": keras.ops.ones((2, 16), "int32"),
    ...                 "padding_mask": keras.ops.ones((2, 16), "int32")}).shape)
    (2, 16, 64)

    References:
        Radford et al., "Language Models are Unsupervised Multitask Learners", 2019 (GPT-2).
        Touvron et al., "LLaMA", 2023; Gemma Team, "Gemma 3 Technical Report", 2025.
    """

    # The name of the last norm layer (GPTBackbone keeps the one of its older files).
    final_norm_name = "final_norm"

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        max_sequence_length,
        num_key_value_heads=None,
        head_dim=None,
        positions="rotary",
        rope_parameters=None,
        normalization="rms_norm",
        norm_epsilon=1e-6,
        norm_unit_offset=False,
        feed_forward="gated",
        activation="silu",
        attention_bias=False,
        attention_output_bias=None,
        feed_forward_bias=False,
        query_key_norm=False,
        attention_scale=None,
        attention_soft_cap=None,
        final_logit_soft_cap=None,
        layer_types=None,
        sliding_window=None,
        rope_layers=None,
        sandwich_norm=False,
        scale_embeddings=False,
        tie_embeddings=True,
        dropout=0.0,
        model_type=None,
        dtype=None,
        **kwargs,
    ):
        check_positive_int("vocabulary_size", vocabulary_size)
        check_positive_int("num_layers", num_layers)
        check_positive_int("num_heads", num_heads)
        check_positive_int("hidden_dim", hidden_dim)
        check_positive_int("intermediate_dim", intermediate_dim)
        check_positive_int("max_sequence_length", max_sequence_length)
        num_key_value_heads = check_positive_int("num_key_value_heads", num_key_value_heads or num_heads)
        check_divisible("num_heads", num_heads, "num_key_value_heads", num_key_value_heads)
        if head_dim is None:
            check_divisible("hidden_dim", hidden_dim, "num_heads", num_heads)
        head_dim = check_positive_int("head_dim", head_dim or hidden_dim // num_heads)
        check_choice("positions", positions, ("rotary", "learned"))
        check_choice("normalization", normalization, ("rms_norm", "layer_norm"))
        check_choice("feed_forward", feed_forward, ("gated", "plain"))
        if isinstance(norm_epsilon, bool) or not isinstance(norm_epsilon, (int, float)) or not norm_epsilon > 0:
            raise ValueError(f"`norm_epsilon` must be a number > 0; received norm_epsilon={norm_epsilon!r}.")
        check_rate("dropout", dropout)
        if sliding_window is not None:
            check_positive_int("sliding_window", sliding_window)
        layer_types = _check_layer_types(layer_types, num_layers, sliding_window)
        rope_parameters = _check_rope_parameters(rope_parameters, layer_types, head_dim)
        rope_layers = _check_rope_layers(rope_layers, num_layers)

        # === Layers ===
        self.embedding = TokenAndPositionEmbedding(
            vocabulary_size,
            max_sequence_length,
            hidden_dim,
            position="learned" if positions == "learned" else "none",
            scale_embeddings=scale_embeddings,
            embeddings_initializer=decoder_initializer(),
            dtype=dtype,
            name="embedding",
        )
        self.embedding_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="embedding_dropout")

        def norm(name=None):
            if normalization == "layer_norm":
                return LayerNormalization(epsilon=norm_epsilon, dtype=dtype, name=name)
            return RMSNormalization(epsilon=norm_epsilon, unit_offset=norm_unit_offset, dtype=dtype, name=name)

        def attention(layer_type, rotary):
            rope = rope_parameters.get(layer_type) if positions == "rotary" and rotary else None
            return MultiHeadAttention(
                num_heads,
                head_dim,
                num_key_value_heads=num_key_value_heads,
                dropout=dropout,
                use_bias=attention_bias,
                use_output_bias=attention_output_bias,
                kernel_initializer=decoder_initializer(),
                rotary_embedding=None if rope is None else _rotary_embedding(rope, head_dim),
                query_key_norm=norm() if query_key_norm else None,
                scale=attention_scale,
                soft_cap=attention_soft_cap,
                sliding_window=sliding_window if layer_type == SLIDING_ATTENTION else None,
                dtype=dtype,
                name="self_attention",
            )

        def feed_forward_network():
            cls = GatedFeedForward if feed_forward == "gated" else FeedForward
            return cls(
                intermediate_dim,
                activation=activation,
                use_bias=feed_forward_bias,
                kernel_initializer=decoder_initializer(),
                dtype=dtype,
                name="feed_forward",
            )

        self.transformer_blocks = [
            TransformerDecoderBlock(
                cross_attention=False,
                norm_first=True,
                sandwich_norm=sandwich_norm,
                dropout=dropout,
                self_attention=attention(layer_type, rope_layers is None or rope_layers[i]),
                feed_forward=feed_forward_network(),
                normalization=norm(),
                dtype=dtype,
                name=f"transformer_block_{i}",
            )
            for i, layer_type in enumerate(layer_types)
        ]
        self.final_norm = norm(self.final_norm_name)

        # === Functional model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        padding_mask = keras.Input(shape=(None,), dtype="int32", name="padding_mask")
        sequence_output = self.decode(token_ids, padding_mask=padding_mask)
        super().__init__(
            inputs={"token_ids": token_ids, "padding_mask": padding_mask},
            outputs=sequence_output,
            dtype=dtype,
            **kwargs,
        )

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.max_sequence_length = max_sequence_length
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.positions = positions
        self.rope_parameters = rope_parameters if positions == "rotary" else None
        self.normalization = normalization
        self.norm_epsilon = float(norm_epsilon)
        self.norm_unit_offset = bool(norm_unit_offset)
        self.feed_forward = feed_forward
        self.activation = activation
        self.attention_bias = bool(attention_bias)
        self.attention_output_bias = bool(attention_bias if attention_output_bias is None else attention_output_bias)
        self.feed_forward_bias = bool(feed_forward_bias)
        self.query_key_norm = bool(query_key_norm)
        self.attention_scale = attention_scale
        self.attention_soft_cap = attention_soft_cap
        self.final_logit_soft_cap = final_logit_soft_cap
        self.layer_types = layer_types
        self.sliding_window = sliding_window
        self.rope_layers = rope_layers
        self.sandwich_norm = bool(sandwich_norm)
        self.scale_embeddings = bool(scale_embeddings)
        self.tie_embeddings = bool(tie_embeddings)
        self.dropout = dropout
        self.model_type = model_type

    def decode(self, token_ids, padding_mask=None, caches=None, cache_index=0):
        """The forward pass, whole or incremental.

        Without `caches`, runs `token_ids` `(B, T)` at positions `[0, T)` and
        returns the hidden states `(B, T, d)`. With them (one `(keys, values)`
        pair per block, from `empty_cache`), the tokens sit at positions
        `[cache_index, cache_index + T)`, their keys and values are written
        into the caches, and the call returns `(hidden_states, caches)`.

        Args:
            token_ids: int tensor `(B, T)`.
            padding_mask: None or `(B, T)`, 1 on real tokens (whole pass only).
            caches: None or a list of `(keys, values)` per block, each
                `(B, num_key_value_heads, cache_length, head_dim)`.
            cache_index: int or scalar int tensor, position of the first token.
        """
        x = self.embedding_dropout(self.embedding(token_ids, start_index=cache_index))  # (B, T, d)
        shared = self._shared_attention_inputs(x, padding_mask, caches, cache_index)
        if caches is None:
            for block, (rotation, mask_and_bias) in zip(self.transformer_blocks, shared):
                x = block(x, padding_mask=padding_mask, rotation=rotation, mask_and_bias=mask_and_bias)
            return self.final_norm(x)
        updated = []
        for block, cache, (rotation, mask_and_bias) in zip(self.transformer_blocks, caches, shared):
            x, cache = block(
                x,
                self_attention_cache=cache,
                self_attention_cache_index=cache_index,
                rotation=rotation,
                mask_and_bias=mask_and_bias,
            )
            updated.append(cache)
        return self.final_norm(x), updated

    def _shared_attention_inputs(self, x, padding_mask, caches, cache_index):
        """Each block's `(rotation, mask_and_bias)`: what its self-attention would compute from
        the positions and masks, computed once per distinct setting and passed to every block.

        Blocks with the same rotary settings share their rotation, and blocks with the same
        window (and head grouping) their mask (Gemma 3 has two of each, one per layer type),
        where each block's own would put L copies into the traced graph that TensorFlow and
        XLA then process. The functional model, built from symbolic inputs without a length
        to take positions from, lets each block compute its own (the same values).
        """
        if isinstance(x, keras.KerasTensor):
            return [(None, None)] * len(self.transformer_blocks)
        # What the blocks would read: the tokens' padding mask in a whole pass (else x's Keras
        # mask), and their positions from `cache_index` with a cache only.
        query_mask = padding_mask if caches is None and padding_mask is not None else keras_mask(x)
        length = ops.shape(x)[1]
        key_length = length if caches is None else ops.shape(caches[0][0])[2]
        start_index, cache_index = (0, None) if caches is None else (cache_index, cache_index)
        rotations, masks, shared = {}, {}, []
        for block in self.transformer_blocks:
            attention, rotation = block.self_attention, None
            rope = attention.rotary_embedding
            if rope is not None:
                key = (
                    rope.max_wavelength,
                    rope.scaling_factor,
                    rope.rotary_dim,
                    repr(rope.rope_scaling),
                    attention.key_dim,
                )
                if key not in rotations:
                    rotations[key] = rope.rotation(length, attention.key_dim, start_index)
                rotation = rotations[key]
            key = (attention.sliding_window, attention.num_heads // attention.num_key_value_heads)
            if key not in masks:
                masks[key] = attention.compute_mask_and_bias(
                    length,
                    key_length,
                    query_mask=query_mask,
                    key_mask=query_mask,
                    use_causal_mask=True,
                    cache_index=cache_index,
                    cached=caches is not None,
                )
            shared.append((rotation, masks[key]))
        return shared

    def empty_cache(self, batch_size, cache_length, dtype=None):
        """Zero KV caches for `decode`: one `(keys, values)` pair per block, each
        `(batch_size, num_key_value_heads, cache_length, head_dim)`."""
        return [block.empty_cache(batch_size, cache_length, dtype) for block in self.transformer_blocks]

    @staticmethod
    def get_layout_map(device_mesh, model_parallel_dim_name="model", data_parallel_dim_name="batch"):
        """How to shard a decoder's weights over the `model_parallel_dim_name` axis of a device mesh,
        for `keras.distribution.ModelParallel` (JAX): tensor parallelism in Megatron's pattern.

        Attention splits its heads (the query, key and value projections by output head, W^O by
        input head; the key / value heads must divide by the axis' size), the feed-forward network
        its hidden units (the first layers by output, the last by input), so each block exchanges
        its partial sums twice; the token table and an untied LM head split the vocabulary. Norms
        and biases are replicated. Build the model inside `distribution.scope()`.

        Args:
            device_mesh: a `keras.distribution.DeviceMesh`.
            model_parallel_dim_name: the mesh axis the weights are split over.
            data_parallel_dim_name: the mesh axis the batch is split over (unused by weights,
                named for `ModelParallel(batch_dim_name=...)`).

        Returns:
            A `keras.distribution.LayoutMap`.

        Example:
        >>> devices = keras.distribution.list_devices()  # e.g. 8 GPUs under JAX
        >>> mesh = keras.distribution.DeviceMesh((1, len(devices)), ("batch", "model"), devices)
        >>> layout_map = DecoderBackbone.get_layout_map(mesh)
        >>> layout_map["transformer_block_0/self_attention/query/kernel"].axes  # heads split
        (None, 'model', None)
        >>> distribution = keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")
        >>> with distribution.scope():
        ...     lm = kzoo.models.CausalLM.from_preset("llama_tiny")
        """
        del data_parallel_dim_name  # the batch axis shards data, not weights
        model = model_parallel_dim_name
        layout_map = keras.distribution.LayoutMap(device_mesh)
        # Keys are regular expressions that must match a variable's whole path.
        layout_map[r".*token_embedding/embeddings"] = (model, None)  # (V, d)
        layout_map[r".*self_attention/(query|key|value)/kernel"] = (None, model, None)  # (d, heads, head_dim)
        layout_map[r".*self_attention/(query|key|value)/bias"] = (model, None)  # (heads, head_dim)
        layout_map[r".*self_attention/attention_output/kernel"] = (model, None, None)  # (heads, head_dim, d)
        layout_map[r".*feed_forward/(gate_dense|intermediate_dense)/kernel"] = (None, model)  # (d, d_ff)
        layout_map[r".*feed_forward/(gate_dense|intermediate_dense)/bias"] = (model,)
        layout_map[r".*feed_forward/output_dense/kernel"] = (model, None)  # (d_ff, d)
        layout_map[r".*lm_head/kernel"] = (None, model)  # (d, V)
        return layout_map

    def get_config(self):
        config = super().get_config()
        config.update(
            vocabulary_size=self.vocabulary_size,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            hidden_dim=self.hidden_dim,
            intermediate_dim=self.intermediate_dim,
            max_sequence_length=self.max_sequence_length,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            positions=self.positions,
            rope_parameters=self.rope_parameters,
            normalization=self.normalization,
            norm_epsilon=self.norm_epsilon,
            norm_unit_offset=self.norm_unit_offset,
            feed_forward=self.feed_forward,
            activation=self.activation,
            attention_bias=self.attention_bias,
            attention_output_bias=self.attention_output_bias,
            feed_forward_bias=self.feed_forward_bias,
            query_key_norm=self.query_key_norm,
            attention_scale=self.attention_scale,
            attention_soft_cap=self.attention_soft_cap,
            final_logit_soft_cap=self.final_logit_soft_cap,
            layer_types=self.layer_types,
            sliding_window=self.sliding_window,
            rope_layers=self.rope_layers,
            sandwich_norm=self.sandwich_norm,
            scale_embeddings=self.scale_embeddings,
            tie_embeddings=self.tie_embeddings,
            dropout=self.dropout,
            model_type=self.model_type,
        )
        return config


def _check_rope_layers(rope_layers, num_layers):
    """`rope_layers` as a list of bools, or None where every layer has RoPE."""
    if rope_layers is None:
        return None
    rope_layers = list(rope_layers)
    if len(rope_layers) != num_layers or any(value not in (True, False) for value in rope_layers):
        raise ValueError(
            f"`rope_layers` must list {num_layers} booleans (one per layer); received rope_layers={rope_layers}."
        )
    return None if all(rope_layers) else [bool(value) for value in rope_layers]


def _check_layer_types(layer_types, num_layers, sliding_window):
    """The type of each layer: the given list, checked, or all sliding / all full."""
    if layer_types is None:
        return [SLIDING_ATTENTION if sliding_window else FULL_ATTENTION] * num_layers
    layer_types = list(layer_types)
    if len(layer_types) != num_layers or any(kind not in LAYER_TYPES for kind in layer_types):
        raise ValueError(
            f"`layer_types` must list {num_layers} entries (one per layer), each one of {list(LAYER_TYPES)}; "
            f"received {layer_types}."
        )
    if SLIDING_ATTENTION in layer_types and sliding_window is None:
        raise ValueError("`layer_types` has sliding-attention layers: give their `sliding_window`.")
    return layer_types


def _check_rope_parameters(rope_parameters, layer_types, head_dim):
    """`{layer type: rotary settings}` for every type present, checked (see `DecoderBackbone`)."""
    rope_parameters = {"rope_theta": 10000.0} if rope_parameters is None else rope_parameters
    if not isinstance(rope_parameters, dict):
        raise ValueError(f"`rope_parameters` must be a dict; received rope_parameters={rope_parameters!r}.")
    per_type = set(rope_parameters) <= set(LAYER_TYPES)
    checked = {}
    for layer_type in dict.fromkeys(layer_types):
        settings = rope_parameters.get(layer_type) if per_type else rope_parameters
        if not isinstance(settings, dict):
            raise ValueError(
                f"`rope_parameters` has no settings for the {layer_type!r} layers; received {rope_parameters!r}."
            )
        theta = settings.get("rope_theta", 10000.0)
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
            raise ValueError(f"`rope_parameters` rope_theta must be a number > 0; received {theta!r}.")
        factor = settings.get("partial_rotary_factor", 1.0)
        if not 0 < factor <= 1 or int(head_dim * factor) % 2:
            raise ValueError(
                f"`rope_parameters` partial_rotary_factor must be in (0, 1] and rotate an even number of the "
                f"{head_dim} head features; received {factor!r}."
            )
        scaling = {k: v for k, v in settings.items() if k not in ("rope_theta", "partial_rotary_factor")}
        check_rope_scaling(scaling)
        checked[layer_type] = dict(settings)
    return checked


def _rotary_embedding(settings, head_dim):
    scaling = {k: v for k, v in settings.items() if k not in ("rope_theta", "partial_rotary_factor")}
    rotary_dim = int(head_dim * settings.get("partial_rotary_factor", 1.0))
    return RotaryEmbedding(
        max_wavelength=settings.get("rope_theta", 10000.0),
        rotary_dim=None if rotary_dim == head_dim else rotary_dim,
        rope_scaling=check_rope_scaling(scaling) if scaling.get("rope_type", "default") != "default" else None,
    )
