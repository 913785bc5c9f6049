"""What the transformer encoder and decoder blocks share."""

import keras

from kzoo import ops as kzoo_ops
from kzoo.layers.add_and_norm import AddAndNorm
from kzoo.layers.feed_forward import FeedForward
from kzoo.layers.layer_normalization import LayerNormalization
from kzoo.layers.multi_head_attention import MultiHeadAttention
from kzoo.ops import get_activation
from kzoo.validation import check_divisible
from kzoo.validation import check_positive_int
from kzoo.validation import check_rate
from kzoo.validation import clone_initializer


class TransformerBlockBase(keras.layers.Layer):
    """Holds the shared arguments and builds the residual sublayers."""

    def __init__(
        self,
        num_heads,
        intermediate_dim,
        dropout=0.0,
        activation="relu",
        norm_first=False,
        layer_norm_epsilon=1e-5,
        num_key_value_heads=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.intermediate_dim = check_positive_int("intermediate_dim", intermediate_dim)
        self.dropout = check_rate("dropout", dropout)
        get_activation(activation)
        self.activation = activation
        self.norm_first = bool(norm_first)
        self.layer_norm_epsilon = layer_norm_epsilon
        self.num_key_value_heads = num_key_value_heads
        if num_key_value_heads is not None:
            check_positive_int("num_key_value_heads", num_key_value_heads)
            check_divisible("num_heads", num_heads, "num_key_value_heads", num_key_value_heads)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        # The pre-LN residuals' dropout (post-LN ones are their `AddAndNorm`'s).
        self.seed_generator = keras.random.SeedGenerator()
        self.supports_masking = True

    def _check_width(self, width):
        if width is None or width % self.num_heads:
            raise ValueError(f"`num_heads` ({self.num_heads}) must divide the input width ({width}).")
        return width // self.num_heads

    def _attention(self, name, query_shape, value_shape=None):
        head_dim = self._check_width(query_shape[-1])
        attention = MultiHeadAttention(
            num_heads=self.num_heads,
            key_dim=head_dim,
            num_key_value_heads=self.num_key_value_heads,
            dropout=self.dropout,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )
        attention.build(query_shape, value_shape)
        return attention

    def _feed_forward(self, x_shape):
        feed_forward = FeedForward(
            self.intermediate_dim,
            activation=self.activation,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name="feed_forward",
        )
        feed_forward.build(x_shape)
        return feed_forward

    def _norm(self, name, x_shape):
        """Pre-LN: the LayerNorm of the sublayer's input. Post-LN: the Add & Norm after it."""
        if self.norm_first:
            norm = LayerNormalization(epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=f"{name}_norm")
        else:
            norm = AddAndNorm(
                self.dropout, epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=f"{name}_norm"
            )
        norm.build(x_shape)
        return norm

    def _residual(self, x, sublayer, norm, training):
        """Post-LN: norm(x + dropout(f(x))). Pre-LN: x + dropout(f(norm(x))).

        `sublayer` returns `(y, extra)`; `extra` (a cache) is passed through.
        """
        if self.norm_first:
            y, extra = sublayer(norm(x, training=training))
            x = kzoo_ops.residual_dropout(x, y, rate=self.dropout, seed=self.seed_generator, training=training)
            return x, extra
        y, extra = sublayer(x)
        return norm(x, y, training=training), extra

    def compute_mask(self, x, previous_mask=None):
        return previous_mask

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            intermediate_dim=self.intermediate_dim,
            dropout=self.dropout,
            activation=self.activation,
            norm_first=self.norm_first,
            layer_norm_epsilon=self.layer_norm_epsilon,
            num_key_value_heads=self.num_key_value_heads,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
        )
        return config
