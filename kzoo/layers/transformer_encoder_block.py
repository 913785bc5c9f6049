import keras

from kzoo._compat import keras_mask
from kzoo.layers._block import TransformerBlockBase


@keras.saving.register_keras_serializable(package="kzoo")
class TransformerEncoderBlock(TransformerBlockBase):
    """A transformer encoder block: self-attention then feed-forward.

    Post-LN (the paper, BERT), the default:
        z = LayerNorm(x + Dropout(SelfAttention(x)))
        y = LayerNorm(z + Dropout(FeedForward(z)))
    Pre-LN (GPT-2, `norm_first=True`):
        z = x + Dropout(SelfAttention(LayerNorm(x)))
        y = z + Dropout(FeedForward(LayerNorm(z)))

    The head size is the input width divided by `num_heads`. Padding comes
    from `padding_mask` `(B, T)` (True = real token), an `attention_mask`
    `(B, T, T)`, or the Keras mask carried by the input (e.g. from
    `TokenAndPositionEmbedding(mask_zero=True)`); the output keeps that mask.

    Args:
        num_heads: int, number of attention heads; must divide the width.
        intermediate_dim: int, hidden width of the feed-forward network.
        dropout: float in [0, 1), on attention weights and both residuals.
        activation: feed-forward activation name ("relu", "gelu", ...).
        norm_first: bool, pre-LN if True, post-LN if False.
        layer_norm_epsilon: float, the LayerNorm epsilon.
        num_key_value_heads: int dividing `num_heads` for grouped-query
            attention; defaults to `num_heads`.
        kernel_initializer: initializer of all kernels.
        bias_initializer: initializer of all biases.
        self_attention: None, or the block's own `MultiHeadAttention`;
            `num_heads` may then be None.
        feed_forward: None, or the block's own feed-forward layer;
            `intermediate_dim` may then be None.
        normalization: None (LayerNorm with `layer_norm_epsilon`), or a
            normalization layer copied for each of the block's norms.
        sandwich_norm: bool, with `norm_first`: also normalize each
            sublayer's output before the residual sum.
        **kwargs: base layer arguments.

    Example:
    >>> block = TransformerEncoderBlock(num_heads=4, intermediate_dim=64)
    >>> tuple(block(keras.random.normal((2, 10, 32))).shape)
    (2, 10, 32)

    References:
        Vaswani et al., "Attention Is All You Need", 2017, sec. 3.1.
        Xiong et al., "On Layer Normalization in the Transformer
        Architecture", 2020 (pre-LN).
    """

    def build(self, x_shape):
        self.self_attention = self._attention("self_attention", x_shape)
        self.self_attention_norm, self.self_attention_output_norm = self._norms("self_attention", x_shape)
        self.feed_forward = self._feed_forward(x_shape)
        self.feed_forward_norm, self.feed_forward_output_norm = self._norms("feed_forward", x_shape)
        self.built = True

    def call(self, x, padding_mask=None, attention_mask=None, training=None):
        if padding_mask is None:
            padding_mask = keras_mask(x)

        def attend(h):
            return self.self_attention(
                h,
                query_mask=padding_mask,
                value_mask=padding_mask,
                attention_mask=attention_mask,
                training=training,
            ), None

        x, _ = self._residual(x, attend, (self.self_attention_norm, self.self_attention_output_norm), training)
        x, _ = self._residual(
            x,
            lambda h: (self.feed_forward(h, training=training), None),
            (self.feed_forward_norm, self.feed_forward_output_norm),
            training,
        )
        return x

    def compute_output_shape(self, x_shape):
        return x_shape
