import keras

from kzoo import ops as kzoo_ops
from kzoo.ops import get_activation
from kzoo.validation import check_positive_int
from kzoo.validation import check_rate
from kzoo.validation import clone_initializer


@keras.saving.register_keras_serializable(package="kzoo")
class GatedFeedForward(keras.layers.Layer):
    """The gated feed-forward network: W_down (act(W_gate x) * (W_up x)).

    A gated linear unit in place of the first layer of the feed-forward
    network (Shazeer, 2020): one projection, passed through the activation,
    gates another element by element. SiLU gives SwiGLU (Llama, Mistral,
    Qwen, SmolLM), the tanh GELU GeGLU (Gemma). Applied to each position
    separately; dropout, if any, acts on the gated hidden activations.

    Args:
        intermediate_dim: int, the hidden width d_ff.
        activation: "silu" (SwiGLU), "gelu_approximate" (GeGLU) or any
            activation `kzoo.layers.FeedForward` takes.
        dropout: float in [0, 1), dropout on the hidden activations.
        output_dim: int, the output width; defaults to the input width.
        use_bias: bool, whether the three projections have biases.
        kernel_initializer: initializer of the kernels.
        bias_initializer: initializer of the biases.
        **kwargs: base layer arguments.

    Example:
    >>> tuple(GatedFeedForward(64)(keras.random.normal((2, 5, 16))).shape)
    (2, 5, 16)

    References:
        Shazeer, "GLU Variants Improve Transformer", 2020.
    """

    def __init__(
        self,
        intermediate_dim,
        activation="silu",
        dropout=0.0,
        output_dim=None,
        use_bias=False,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.intermediate_dim = check_positive_int("intermediate_dim", intermediate_dim)
        get_activation(activation)  # a bad name fails here
        self.activation = activation
        self.dropout = check_rate("dropout", dropout)
        self.output_dim = None if output_dim is None else check_positive_int("output_dim", output_dim)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.seed_generator = keras.random.SeedGenerator()
        self.supports_masking = True

    def build(self, input_shape):
        def dense(units, name):
            return keras.layers.Dense(
                units,
                use_bias=self.use_bias,
                kernel_initializer=clone_initializer(self.kernel_initializer),
                bias_initializer=clone_initializer(self.bias_initializer),
                dtype=self.dtype_policy,
                name=name,
            )

        self.gate_dense = dense(self.intermediate_dim, "gate_dense")
        self.gate_dense.build(input_shape)
        self.intermediate_dense = dense(self.intermediate_dim, "intermediate_dense")
        self.intermediate_dense.build(input_shape)
        self.output_dense = dense(self.output_dim or input_shape[-1], "output_dense")
        self.output_dense.build((*input_shape[:-1], self.intermediate_dim))
        self.built = True

    def call(self, inputs, training=None):
        gate = get_activation(self.activation)(self.gate_dense(inputs))  # act(W_gate x), (..., d_ff)
        hidden = gate * self.intermediate_dense(inputs)
        noise = kzoo_ops.dropout_noise(keras.ops.shape(hidden), self.dropout, self.seed_generator) if training else None
        return self.output_dense(kzoo_ops.dropout(hidden, noise, self.dropout))

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.output_dim or input_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update(
            intermediate_dim=self.intermediate_dim,
            activation=self.activation,
            dropout=self.dropout,
            output_dim=self.output_dim,
            use_bias=self.use_bias,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
        )
        return config
