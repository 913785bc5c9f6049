"""What the transformer encoder and decoder blocks share."""

import keras

from kzoo import ops as kzoo_ops
from kzoo.layers._prototypes import copy_layer
from kzoo.layers._prototypes import deserialize_patterns
from kzoo.layers._prototypes import unbuilt_config
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
    """Holds the shared arguments and builds the residual sublayers.

    The sublayers are built from the arguments (the classic blocks), or
    copied from injected layers: `self_attention` (a `MultiHeadAttention`),
    `feed_forward` (any layer from `(..., d)` to `(..., d)`, e.g.
    `GatedFeedForward`) and `normalization` (a normalization layer, e.g.
    `RMSNormalization`, one copy per norm). The block builds its own copy of
    each from the layer's config (the layer passed in stays unused), so one
    layer can serve as the pattern of many blocks.
    """

    def __init__(
        self,
        num_heads=None,
        intermediate_dim=None,
        dropout=0.0,
        activation="relu",
        norm_first=False,
        layer_norm_epsilon=1e-5,
        num_key_value_heads=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        self_attention=None,
        feed_forward=None,
        normalization=None,
        sandwich_norm=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if self_attention is not None and not isinstance(self_attention, MultiHeadAttention):
            raise ValueError(
                f"`self_attention` must be None or a MultiHeadAttention; received {type(self_attention).__name__}."
            )
        for name, layer in (("feed_forward", feed_forward), ("normalization", normalization)):
            if layer is not None and not isinstance(layer, keras.layers.Layer):
                raise ValueError(f"`{name}` must be None or a Keras layer; received {type(layer).__name__}.")
        if self_attention is None or num_heads is not None:
            check_positive_int("num_heads", num_heads)
        if feed_forward is None or intermediate_dim is not None:
            check_positive_int("intermediate_dim", intermediate_dim)
        self.num_heads = self_attention.num_heads if self_attention is not None else num_heads
        self.intermediate_dim = intermediate_dim
        if sandwich_norm and not norm_first:
            raise ValueError(
                "`sandwich_norm=True` normalizes the sublayer outputs of a pre-LN block: set `norm_first=True`."
            )
        self.sandwich_norm = bool(sandwich_norm)
        # Prototypes: the block builds its own copies (see `_copy`), in the order of the classic blocks.
        self._prototypes = {
            name: unbuilt_config(layer)
            for name, layer in (
                ("self_attention", self_attention),
                ("feed_forward", feed_forward),
                ("normalization", normalization),
            )
            if layer is not None
        }
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

    def _copy(self, kind, name):
        """A new layer from the pattern `kind`, named `name`, with the block's dtype policy."""
        return copy_layer(self._prototypes[kind], name, self.dtype_policy)

    def _attention(self, name, query_shape, value_shape=None):
        if name == "self_attention" and name in self._prototypes:
            attention = self._copy(name, name)
            attention.build(query_shape, value_shape)
            return attention
        if self.num_heads is None:
            raise ValueError(f"`num_heads` is needed to build the block's {name}.")
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
        if "feed_forward" in self._prototypes:
            feed_forward = self._copy("feed_forward", "feed_forward")
            feed_forward.build(x_shape)
            return feed_forward
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
        """Pre-LN: the norm of the sublayer's input. Post-LN: the norm after the residual sum
        (an `AddAndNorm` unless a `normalization` was injected)."""
        if "normalization" in self._prototypes:
            norm = self._copy("normalization", name)
        elif self.norm_first:
            norm = LayerNormalization(epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name)
        else:
            norm = AddAndNorm(self.dropout, epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name)
        norm.build(x_shape)
        return norm

    def _norms(self, name, x_shape):
        """The norms around the sublayer `name`: `(input norm, output norm or None)`.

        Pre-LN: `<name>_norm` on the sublayer's input, and with `sandwich_norm`
        `<name>_output_norm` on its output. Post-LN: `<name>_norm` after the sum.
        """
        output_norm = self._norm(f"{name}_output_norm", x_shape) if self.sandwich_norm else None
        return self._norm(f"{name}_norm", x_shape), output_norm

    def _residual(self, x, sublayer, norms, training):
        """Post-LN: norm(x + dropout(f(x))). Pre-LN: x + dropout(f(norm(x))), with
        `sandwich_norm` x + dropout(output_norm(f(norm(x)))).

        `sublayer` returns `(y, extra)`; `extra` (a cache) is passed through.
        """
        norm, output_norm = norms
        if self.norm_first:
            y, extra = sublayer(norm(x, training=training))
            if output_norm is not None:
                y = output_norm(y, training=training)
            x = kzoo_ops.residual_dropout(x, y, rate=self.dropout, seed=self.seed_generator, training=training)
            return x, extra
        y, extra = sublayer(x)
        if isinstance(norm, AddAndNorm):
            return norm(x, y, training=training), extra
        x = kzoo_ops.residual_dropout(x, y, rate=self.dropout, seed=self.seed_generator, training=training)
        return norm(x), extra

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
            self_attention=self._prototypes.get("self_attention"),
            feed_forward=self._prototypes.get("feed_forward"),
            normalization=self._prototypes.get("normalization"),
            sandwich_norm=self.sandwich_norm,
        )
        return config

    @classmethod
    def from_config(cls, config):
        return super().from_config(deserialize_patterns(config, ("self_attention", "feed_forward", "normalization")))
