import keras

from kzoo._compat import keras_mask
from kzoo.layers._block import TransformerBlockBase
from kzoo.layers.masks import merge_masks


@keras.saving.register_keras_serializable(package="kzoo")
class TransformerDecoderBlock(TransformerBlockBase):
    """A transformer decoder block: causal self-attention, cross-attention, FFN.

    Self-attention is always causal: position t sees positions <= t. With
    `cross_attention=True` a second attention takes its queries from the
    decoder and its keys/values from `encoder_sequence`. Residual and LayerNorm
    placement follow `norm_first` exactly as in `TransformerEncoderBlock`
    (post-LN by default, pre-LN as in GPT-2). With `cross_attention=False` the
    block is a GPT block.

    Masks: `padding_mask` / `attention_mask` (or the input's Keras mask) for
    the decoder tokens, `encoder_padding_mask` / `encoder_attention_mask` (or
    the encoder sequence's Keras mask) for the encoder tokens.

    A stack of blocks computes what their self-attentions share once and
    passes it to each: `rotation`, the rotary angles' cosines and sines at
    the tokens' positions (`self_attention.rotary_embedding.rotation`), and
    `mask_and_bias`, the self-attention's masks merged
    (`self_attention.compute_mask_and_bias`), which then replaces the
    decoder tokens' masks there.

    Incremental decoding: pass `self_attention_cache`, a `(keys, values)`
    pair of `(B, heads, max_length, head_dim)` tensors (from `empty_cache`), and
    `self_attention_cache_index`, the position of the first token of `x`; the
    call returns `(y, self_attention_cache)` and, with cross-attention, also
    the `cross_attention_cache` (computed from `encoder_sequence` on the first
    call, passed back in later). While decoding, `attention_mask` must span
    the `max_length` cache slots.

    Args:
        num_heads: int, number of attention heads; must divide the width.
        intermediate_dim: int, hidden width of the feed-forward network.
        dropout: float in [0, 1), on attention weights and every residual.
        activation: feed-forward activation name.
        norm_first: bool, pre-LN if True, post-LN if False.
        cross_attention: bool, whether the block attends to an encoder.
        layer_norm_epsilon: float, the LayerNorm epsilon.
        num_key_value_heads: int dividing `num_heads`; defaults to `num_heads`.
        kernel_initializer: initializer of all kernels.
        bias_initializer: initializer of all biases.
        self_attention: None, or the block's own `MultiHeadAttention` (with
            its heads, head size, biases, rotary positions, QK-norm, sliding
            window...); `num_heads` may then be None.
        feed_forward: None, or the block's own feed-forward layer (e.g.
            `GatedFeedForward`); `intermediate_dim` may then be None.
        normalization: None (LayerNorm with `layer_norm_epsilon`), or a
            normalization layer (e.g. `RMSNormalization`) copied for each of
            the block's norms.
        sandwich_norm: bool, with `norm_first`: also normalize each
            sublayer's output before the residual sum (Gemma 2 and 3's four
            norms per block).
        **kwargs: base layer arguments.

    Example:
    >>> block = TransformerDecoderBlock(num_heads=4, intermediate_dim=64)
    >>> y = block(keras.random.normal((2, 7, 32)), keras.random.normal((2, 9, 32)))
    >>> tuple(y.shape)
    (2, 7, 32)
    >>> llama_block = TransformerDecoderBlock(
    ...     cross_attention=False, norm_first=True,
    ...     self_attention=kzoo.layers.MultiHeadAttention(
    ...         4, 8, num_key_value_heads=2, use_bias=False, rotary_embedding=kzoo.layers.RotaryEmbedding()),
    ...     feed_forward=kzoo.layers.GatedFeedForward(64, activation="silu"),
    ...     normalization=kzoo.layers.RMSNormalization(epsilon=1e-5))
    >>> tuple(llama_block(keras.random.normal((2, 7, 32))).shape)
    (2, 7, 32)

    References:
        Vaswani et al., "Attention Is All You Need", 2017, sec. 3.1.
    """

    def __init__(self, num_heads=None, intermediate_dim=None, cross_attention=True, **kwargs):
        super().__init__(num_heads, intermediate_dim, **kwargs)
        self.cross_attention = bool(cross_attention)

    def build(self, x_shape, encoder_sequence_shape=None):
        self.self_attention = self._attention("self_attention", x_shape)
        self.self_attention_norm, self.self_attention_output_norm = self._norms("self_attention", x_shape)
        if self.cross_attention:
            self.cross_attention_layer = self._attention("cross_attention", x_shape, encoder_sequence_shape or x_shape)
            self.cross_attention_norm, self.cross_attention_output_norm = self._norms("cross_attention", x_shape)
        self.feed_forward = self._feed_forward(x_shape)
        self.feed_forward_norm, self.feed_forward_output_norm = self._norms("feed_forward", x_shape)
        self.built = True

    def empty_cache(self, batch_size, max_length, dtype=None):
        """A zero self-attention cache for `max_length` positions."""
        return self.self_attention.empty_cache(batch_size, max_length, dtype)

    def call(
        self,
        x,
        encoder_sequence=None,
        padding_mask=None,
        attention_mask=None,
        encoder_padding_mask=None,
        encoder_attention_mask=None,
        self_attention_cache=None,
        self_attention_cache_index=None,
        cross_attention_cache=None,
        training=None,
        rotation=None,
        mask_and_bias=None,
    ):
        decoding = self_attention_cache is not None
        if decoding and self_attention_cache_index is None:
            raise ValueError("`self_attention_cache_index` is required with `self_attention_cache`.")
        if self.cross_attention and encoder_sequence is None and cross_attention_cache is None:
            raise ValueError(
                "This block has `cross_attention=True`: pass `encoder_sequence` (or a `cross_attention_cache`)."
            )
        if not self.cross_attention and encoder_sequence is not None:
            raise ValueError("This block has `cross_attention=False` but `encoder_sequence` was passed.")
        if padding_mask is None:
            padding_mask = keras_mask(x)

        def self_attend(h):
            result = self.self_attention(
                h,
                query_mask=padding_mask,
                value_mask=None if decoding else padding_mask,
                attention_mask=attention_mask,
                use_causal_mask=True,
                cache=self_attention_cache,
                cache_index=self_attention_cache_index,
                training=training,
                rotation=rotation,
                mask_and_bias=mask_and_bias,
            )
            return result if decoding else (result, None)

        x, self_attention_cache = self._residual(
            x, self_attend, (self.self_attention_norm, self.self_attention_output_norm), training
        )

        if self.cross_attention:
            if encoder_padding_mask is None and encoder_sequence is not None:
                encoder_padding_mask = keras_mask(encoder_sequence)
            encoder_mask = merge_masks(key_mask=encoder_padding_mask, attention_mask=encoder_attention_mask)
            if decoding and cross_attention_cache is None:
                cross_attention_cache = self.cross_attention_layer.compute_cache(encoder_sequence)

            def cross_attend(h):
                cached = cross_attention_cache is not None
                result = self.cross_attention_layer(
                    h,
                    None if cached else encoder_sequence,
                    query_mask=padding_mask,
                    attention_mask=encoder_mask,
                    cache=cross_attention_cache,
                    training=training,
                )
                return result if cached else (result, None)

            x, cross_attention_cache = self._residual(
                x, cross_attend, (self.cross_attention_norm, self.cross_attention_output_norm), training
            )

        x, _ = self._residual(
            x,
            lambda h: (self.feed_forward(h, training=training), None),
            (self.feed_forward_norm, self.feed_forward_output_norm),
            training,
        )
        if not decoding:
            return x
        if self.cross_attention:
            return x, self_attention_cache, cross_attention_cache
        return x, self_attention_cache

    def compute_output_shape(self, x_shape, encoder_sequence_shape=None):
        return x_shape

    def compute_output_spec(
        self,
        x,
        encoder_sequence=None,
        self_attention_cache=None,
        cross_attention_cache=None,
        **kwargs,
    ):
        output = keras.KerasTensor(x.shape, dtype=self.compute_dtype)
        if self_attention_cache is None:
            return output

        def spec(cache):
            return tuple(keras.KerasTensor(part.shape, dtype=part.dtype) for part in cache)

        if not self.cross_attention:
            return output, spec(self_attention_cache)
        if cross_attention_cache is None:
            heads = self.num_key_value_heads or self.num_heads
            shape = (x.shape[0], heads, encoder_sequence.shape[1], x.shape[-1] // self.num_heads)
            cross_attention_cache = (keras.KerasTensor(shape, dtype=self.compute_dtype),) * 2
        return output, spec(self_attention_cache), spec(cross_attention_cache)

    def get_config(self):
        config = super().get_config()
        config.update(cross_attention=self.cross_attention)
        return config
