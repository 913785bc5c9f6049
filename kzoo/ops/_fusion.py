"""How a kzoo op runs: where it runs (one function), and its fused TensorFlow implementation.

Each fused op in `kzoo.ops` is three functions of tensors:

- `reference(*args, **static)`: plain `keras.ops`, differentiated by the
  backend; it runs in inference, on every backend but TensorFlow's graphs,
  inside whole-model XLA, and whenever `kzoo.config` turns fusion off.
- `forward(*args, **static) -> (outputs, saved)`: the same values, written for
  the written-out gradient: `saved` holds the few tensors it reads besides the
  arguments (a row's statistics, the softmax weights).
- `vjp(saved, output_grads, *args, **static)`: one gradient per argument
  (None for integer or missing arguments); or None, to let TensorFlow
  differentiate the compiled forward.

`call_fused_op` runs `forward` and `vjp` each as one XLA computation while
TensorFlow traces a training step that it runs op by op: TensorFlow would run
each op of an element-wise chain as its own pass over memory (slowly in
bfloat16) and keep every intermediate for the gradient; XLA fuses the chain
into one loop. The matrix products stay outside, with TensorFlow's oneDNN
kernels (XLA:CPU does not use AMX for bfloat16 matmuls).

The compiled pair is shared by every call with the same functions and static
arguments, so the layers of a model with equal shapes compile each chain once.
"""

import keras
from keras import ops

from kzoo import _compat
from kzoo import config

# (forward, vjp, static arguments, which arguments are given) -> (forward, backward) tf.functions.
_COMPILED = {}


def execution_mode():
    """Where the code calling it runs: the one place kzoo asks the backend.

    Returns:
        "graph": TensorFlow traces a graph that it runs op by op (`model.fit`
            without XLA, `tf.function`): where fused ops pay off.
        "xla": TensorFlow traces a function it compiles whole with XLA
            (`jit_compile=True`), which fuses and differentiates by itself.
        "eager": anything else: eager TensorFlow, JAX (which compiles the
            whole step itself) and PyTorch.
    """
    if keras.backend.backend() != "tensorflow":
        return "eager"
    import tensorflow as tf

    if tf.executing_eagerly():
        return "eager"
    return "xla" if _compat.in_xla_context() else "graph"


def fuses(training):
    """Whether a fused op called with `training` runs its fused implementation."""
    return bool(training) and config.is_fused_training_enabled() and execution_mode() == "graph"


def run_op(reference, forward, vjp, args, static, training):
    """`reference(*args, **static)`, or its fused equivalent where `fuses(training)`."""
    if fuses(training):
        return call_fused_op(forward, vjp, args, static)
    return reference(*args, **static)


def call_fused_op(forward, vjp, args, static):
    """`forward(*args, **static)[0]` with the gradient `vjp`, each compiled as one XLA computation."""
    import tensorflow as tf

    # Variables are passed by value (read here).
    args = [None if arg is None else tf.convert_to_tensor(arg) for arg in args]
    given = tuple(i for i, arg in enumerate(args) if arg is not None)
    key = (forward, vjp, tuple(sorted(static.items())), given, len(args))
    if key not in _COMPILED:
        _COMPILED[key] = _compile(forward, vjp, static, given, len(args))
    compiled_forward, compiled_backward = _COMPILED[key]
    tensors = [args[i] for i in given]
    if compiled_backward is None:  # TensorFlow differentiates the compiled forward
        return compiled_forward(*tensors)

    @tf.custom_gradient
    def call(*tensors):
        outputs, saved = compiled_forward(*tensors)

        def grad(*output_grads):
            flat = tf.nest.flatten(outputs)
            output_grads = [tf.zeros_like(y) if g is None else g for y, g in zip(flat, output_grads)]
            output_grads = tf.nest.pack_sequence_as(outputs, output_grads)
            return list(compiled_backward(saved, output_grads, *tensors))

        return outputs, grad

    return call(*tensors)


def _compile(forward, vjp, static, given, count):
    import tensorflow as tf

    def with_none(tensors):
        full = [None] * count
        for i, tensor in zip(given, tensors):
            full[i] = tensor
        return full

    def compile(fn):
        return tf.function(fn, jit_compile=True, autograph=False)

    if vjp is None:
        return compile(lambda *tensors: forward(*with_none(tensors), **static)[0]), None

    def backward(saved, grads, *tensors):
        gradients = vjp(saved, grads, *with_none(tensors), **static)
        return [gradients[i] for i in given]

    return compile(lambda *tensors: forward(*with_none(tensors), **static)), compile(backward)


def sum_leading_axes(x):
    """`x` summed over every axis but the last, in float32: a bias's gradient.

    As a product with a row of ones: XLA:CPU reduces over leading axes one
    column at a time, several times slower than the product.

    Example:
    >>> keras.ops.convert_to_numpy(sum_leading_axes(keras.ops.ones((2, 3, 4)))).tolist()
    [6.0, 6.0, 6.0, 6.0]
    """
    rows = ops.reshape(ops.cast(x, "float32"), (-1, x.shape[-1]))
    return ops.matmul(ops.ones((1, ops.shape(rows)[0]), "float32"), rows)[0]
