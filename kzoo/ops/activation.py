"""Activations by name, and the feed-forward chain bias + activation + dropout as one fused op."""

import math

import keras
from keras import ops

from kzoo.ops._fusion import run_op
from kzoo.ops._fusion import sum_leading_axes
from kzoo.ops.dropout import dropout
from kzoo.ops.dropout import training_noise


def get_activation(name):
    """A Keras activation by name, plus "gelu_approximate" (GPT-2's tanh GELU).

    Example:
    >>> keras.ops.convert_to_numpy(get_activation("gelu_approximate")(keras.ops.array([0.0, 10.0]))).tolist()
    [0.0, 10.0]
    """
    if name == "gelu_approximate":
        return gelu_approximate
    if name in ("silu", "swish"):
        return silu
    try:
        return keras.activations.get(name)
    except ValueError as error:
        raise ValueError(
            "`activation` must be a Keras activation name (e.g. 'relu', 'gelu') "
            f"or 'gelu_approximate'; received activation={name!r}."
        ) from error


def silu(x):
    """SiLU (swish), x sigmoid(x), as `keras.activations.silu` computes it.

    Written out because TensorFlow's `tf.nn.silu` is a `tf.custom_gradient`, which in a traced
    function registers its gradient in TensorFlow's global registry, never cleared, with the
    traced graph in its closure (tensorflow#97697): every function that ran the activation
    kept its model's weights alive after the model was deleted.

    Example:
    >>> keras.ops.convert_to_numpy(silu(keras.ops.array([-1.0, 0.0, 1.0]))).round(4)
    array([-0.2689,  0.    ,  0.7311], dtype=float32)
    """
    return x * ops.sigmoid(x)


def gelu_approximate(x):
    """GPT-2's tanh GELU, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).

    Computed as the equal x sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)): fewer
    ops than the tanh form, and XLA:CPU's sigmoid is faster than its tanh.

    Example:
    >>> keras.ops.convert_to_numpy(gelu_approximate(keras.ops.array([-1.0, 0.0, 1.0]))).round(4)
    array([-0.1588,  0.    ,  0.8412], dtype=float32)
    """
    a = 2.0 * math.sqrt(2.0 / math.pi)
    return x * ops.sigmoid(x * (a + (a * 0.044715) * ops.square(x)))


def bias_activation_dropout(x, bias=None, *, activation="relu", rate=0.0, seed=None, training=False):
    """`Dropout(activation(x + bias))`: the hidden layer of a feed-forward network.

    Args:
        x: tensor `(..., d)`, the product `x W`.
        bias: None or the bias `(d,)`.
        activation: what `get_activation` takes. For "relu"
            and "gelu_approximate" the fused gradient is written out; for
            others TensorFlow differentiates the fused forward.
        rate: float in [0, 1), dropout on the activations in training.
        seed: a `keras.random.SeedGenerator` or int for the dropout.
        training: bool, whether dropout is active (and the op may run fused).

    Example:
    >>> keras.ops.convert_to_numpy(bias_activation_dropout(keras.ops.array([-2.0, 2.0]), keras.ops.ones(2))).tolist()
    [0.0, 3.0]
    """
    get_activation(activation)  # a bad name fails here, naming the argument
    noise = training_noise(ops.shape(x), rate, seed, training)
    vjp = _vjp if activation in _DERIVATIVES else None
    static = dict(activation=activation, rate=rate)
    return run_op(_reference, _forward, vjp, (x, bias, noise), static, training)


def _reference(x, bias, noise, activation, rate):
    if bias is not None:
        x = ops.add(x, bias)
    return dropout(get_activation(activation)(x), noise, rate)


def _forward(x, bias, noise, activation, rate):
    """The reference's output; nothing saved for the gradient but the arguments."""
    return _reference(x, bias, noise, activation, rate), ()


def _vjp(saved, grad, x, bias, noise, activation, rate):
    """The gradient from the arguments: activation'(x + bias) times the dropped gradient."""
    pre = x if bias is None else ops.add(x, bias)
    grad = ops.cast(dropout(grad, noise, rate), "float32") * _DERIVATIVES[activation](ops.cast(pre, "float32"))
    grad_bias = None if bias is None else ops.cast(sum_leading_axes(grad), bias.dtype)
    return ops.cast(grad, x.dtype), grad_bias, None


def _gelu_approximate_derivative(x):
    a = 2.0 * math.sqrt(2.0 / math.pi)
    b = a * 0.044715
    s = ops.sigmoid(x * (a + b * ops.square(x)))
    return s + x * s * (1.0 - s) * (a + 3.0 * b * ops.square(x))


def _relu_derivative(x):
    return ops.cast(ops.greater(x, 0.0), x.dtype)


_DERIVATIVES = {"gelu_approximate": _gelu_approximate_derivative, "relu": _relu_derivative}
