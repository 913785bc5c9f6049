import keras

from kzoo import ops as kzoo_ops
from kzoo.ops import get_activation
from kzoo.validation import check_positive_int
from kzoo.validation import check_rate
from kzoo.validation import clone_initializer


@keras.saving.register_keras_serializable(package="kzoo")
class FeedForward(keras.layers.Layer):
    """The position-wise feed-forward network: W_2 act(W_1 x + b_1) + b_2.

    Applied to each position separately. Dropout, if any, acts on the hidden
    activations; the residual dropout of a transformer block is the block's.
    The hidden layer's bias, activation and dropout are one op,
    `kzoo.ops.bias_activation_dropout`, fused in a TensorFlow training step.

    Args:
        intermediate_dim: int, the hidden width d_ff.
        activation: activation name: "relu" (the paper), "gelu" (BERT),
            "gelu_approximate" (GPT-2) or any Keras activation name.
        dropout: float in [0, 1), dropout on the hidden activations.
        output_dim: int, the output width; defaults to the input width.
        use_bias: bool.
        kernel_initializer: initializer of both kernels.
        bias_initializer: initializer of both biases.
        **kwargs: base layer arguments.

    Example:
    >>> tuple(FeedForward(64)(keras.random.normal((2, 5, 16))).shape)
    (2, 5, 16)

    References:
        Vaswani et al., "Attention Is All You Need", 2017, eq. (2).
    """

    def __init__(
        self,
        intermediate_dim,
        activation="relu",
        dropout=0.0,
        output_dim=None,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.intermediate_dim = check_positive_int("intermediate_dim", intermediate_dim)
        self.activation = activation
        get_activation(activation)  # a bad name fails here
        self.dropout = check_rate("dropout", dropout)
        self.output_dim = None if output_dim is None else check_positive_int("output_dim", output_dim)
        self.use_bias = use_bias
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

        self.intermediate_dense = dense(self.intermediate_dim, "intermediate_dense")
        self.intermediate_dense.build(input_shape)
        self.output_dense = dense(self.output_dim or input_shape[-1], "output_dense")
        self.output_dense.build((*input_shape[:-1], self.intermediate_dim))
        self.built = True

    def call(self, inputs, training=None):
        hidden = self.intermediate_dense(inputs)  # (..., d_ff), W_1 x + b_1
        hidden = kzoo_ops.bias_activation_dropout(
            hidden, activation=self.activation, rate=self.dropout, seed=self.seed_generator, training=training
        )
        return self.output_dense(hidden)

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
