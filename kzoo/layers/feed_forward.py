import functools
import math

import keras
from keras import ops

from kzoo.layers._validation import check_positive_int
from kzoo.layers._validation import clone_initializer
from kzoo.layers._validation import check_rate
from kzoo.ops import dropout
from kzoo.ops import dropout_noise
from kzoo.ops import fused
from kzoo.ops import sum_leading_axes


def get_activation(name):
    """A Keras activation by name, plus "gelu_approximate" (GPT-2's tanh GELU)."""
    if name == "gelu_approximate":
        return gelu_approximate
    try:
        return keras.activations.get(name)
    except ValueError as error:
        raise ValueError(
            "`activation` must be a Keras activation name (e.g. 'relu', 'gelu') "
            f"or 'gelu_approximate'; received activation={name!r}."
        ) from error


def gelu_approximate(x):
    """GPT-2's tanh GELU, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).

    Computed as the equal x sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)): fewer
    ops than the tanh form, and XLA:CPU's sigmoid is faster than its tanh.
    """
    a = 2.0 * math.sqrt(2.0 / math.pi)
    return x * ops.sigmoid(x * (a + (a * 0.044715) * ops.square(x)))


def _gelu_approximate_derivative(x):
    a = 2.0 * math.sqrt(2.0 / math.pi)
    b = a * 0.044715
    s = ops.sigmoid(x * (a + b * ops.square(x)))
    return s + x * s * (1.0 - s) * (a + 3.0 * b * ops.square(x))


def _relu_derivative(x):
    return ops.cast(ops.greater(x, 0.0), x.dtype)


# Activations whose training step uses a written-out gradient (see `_activate_vjp`).
_DERIVATIVES = {"gelu_approximate": _gelu_approximate_derivative, "relu": _relu_derivative}


def _activate(hidden, bias, noise, activation, rate):
    """dropout(activation(hidden + bias)); nothing saved for the gradient but the arguments."""
    if bias is not None:
        hidden = ops.add(hidden, bias)
    return dropout(activation(hidden), noise, rate), ()


def _activate_vjp(saved, grad, hidden, bias, noise, activation, rate, derivative):
    """The gradient from the arguments: activation'(hidden + bias) times the dropped gradient."""
    pre = hidden if bias is None else ops.add(hidden, bias)
    grad = ops.cast(dropout(grad, noise, rate), "float32") * derivative(ops.cast(pre, "float32"))
    grad_bias = None if bias is None else ops.cast(sum_leading_axes(grad), bias.dtype)
    return ops.cast(grad, hidden.dtype), grad_bias, None


@keras.saving.register_keras_serializable(package="kzoo")
class FeedForward(keras.layers.Layer):
    """The position-wise feed-forward network: W_2 act(W_1 x + b_1) + b_2.

    Applied to each position separately. Dropout, if any, acts on the hidden
    activations; the residual dropout of a transformer block is the block's.

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
    >>> FeedForward(64)(keras.random.normal((2, 5, 16))).shape
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
        self.activation_fn = get_activation(activation)
        self.dropout = check_rate("dropout", dropout)
        self.output_dim = None if output_dim is None else check_positive_int("output_dim", output_dim)
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
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
        self.hidden_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.built = True

    def call(self, inputs, training=None):
        if not training:
            return self.output_dense(self.activation_fn(self.intermediate_dense(inputs)))
        # Training: the product as `Dense` computes it, then bias, activation
        # and dropout as one fused computation (`kzoo.ops.fused`).
        hidden = ops.matmul(inputs, self.intermediate_dense.kernel)
        noise = dropout_noise(ops.shape(hidden), self.dropout, getattr(self.hidden_dropout, "seed_generator", None))
        derivative = _DERIVATIVES.get(self.activation)
        settings = dict(activation=self.activation_fn, rate=self.dropout)
        if derivative is None:  # TensorFlow differentiates the compiled chain
            hidden = fused(lambda *args: _activate(*args, **settings)[0], hidden, self.intermediate_dense.bias, noise)
        else:
            vjp = functools.partial(_activate_vjp, derivative=derivative)
            hidden = fused(_activate, hidden, self.intermediate_dense.bias, noise, vjp=vjp, **settings)
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
