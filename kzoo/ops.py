"""Backend-aware pieces that `keras.ops` cannot express.

`keras.ops` has no assertion op and no way to ask for operator fusion, so the
run-time check kzoo needs (token ids inside the vocabulary) and the fusion of
element-wise training code (`fused`) dispatch on the backend here and nowhere
else. The small helpers that training code compiled by `fused` shares (dropout
noise, the dropout rule, `sum_leading_axes`) live beside it.
"""

import keras
from keras import ops


def check_token_ids(token_ids, vocabulary_size, name="token_ids"):
    """Fails loudly when any id is outside `[0, vocabulary_size)`.

    An embedding lookup with a bad id is silently wrong on most devices: TF on
    GPU returns zeros and XLA clamps the index to the last row. This check
    raises instead:

    - TensorFlow, eager or `tf.function`: `InvalidArgumentError` naming the
      argument and the range. XLA (`jit_compile=True`) drops assertions, so
      the caller also gets `valid_mask` to poison the bad rows with NaN.
    - JAX: `ValueError` eagerly, and from compiled code on CPU through a
      `jax.debug.callback`. On a GPU or TPU that callback would stall every
      step for the host (+8-10 ms per training step on an H100, where the
      whole keras-hub GPT step takes 5 ms), so compiled code there relies on
      `valid_mask`'s NaN rows, as under TensorFlow's XLA.
    - PyTorch: a plain Python check.

    Args:
        token_ids: integer tensor of any shape.
        vocabulary_size: int, the exclusive upper bound.
        name: the argument name used in the error message.

    Returns:
        `(token_ids, valid_mask)`: the ids (with a control dependency on the
        check where the backend needs one) and a boolean tensor, True where
        the id is in range.

    Example:
    >>> ids, valid = check_token_ids(keras.ops.array([1, 2]), 5)
    """
    message = (
        f"`{name}` must be in [0, {vocabulary_size}) "
        f"(vocabulary_size={vocabulary_size})."
    )
    valid = ops.logical_and(
        ops.greater_equal(token_ids, 0), ops.less(token_ids, vocabulary_size)
    )
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        check = tf.debugging.Assert(
            tf.reduce_all(valid),
            [message, "min:", tf.reduce_min(token_ids), "max:", tf.reduce_max(token_ids)],
            summarize=1,
        )
        with tf.control_dependencies([check]):
            token_ids = tf.identity(token_ids)
    elif backend == "jax" and _traced_by_jax(token_ids):
        import jax

        # Compiled: only on CPU, where the host callback is cheap (see above).
        if jax.default_backend() == "cpu":

            def raise_if_invalid(all_valid, low, high):
                if not all_valid:
                    raise ValueError(f"{message} Got min={low}, max={high}.")

            jax.debug.callback(
                raise_if_invalid, ops.all(valid), ops.min(token_ids), ops.max(token_ids)
            )
    elif not bool(ops.all(valid)):
        raise ValueError(
            f"{message} Got min={int(ops.min(token_ids))}, "
            f"max={int(ops.max(token_ids))}."
        )
    return token_ids, valid


def _traced_by_jax(x):
    """Whether `x` is a JAX tracer (inside `jax.jit`), not a concrete array."""
    import jax

    return isinstance(x, jax.core.Tracer)


def fused(fn, *args, vjp=None, **kwargs):
    """`fn(*args, **kwargs)`, compiled as one fused XLA computation under TensorFlow.

    For element-wise chains (bias + activation + dropout, mask + softmax +
    dropout, residual + dropout + LayerNorm, the cross-entropy): TensorFlow
    runs each op of such a chain as its own pass over memory, forward and
    backward, and slowly in bfloat16; XLA fuses the chain into one loop, and
    its gradient into another. The matrix products stay outside, with
    TensorFlow's oneDNN kernels, which XLA:CPU does not use (and with AMX,
    bfloat16 matmuls run about 5x faster there than under XLA).

    With `vjp`, the gradient is that hand-written function, compiled as a
    second XLA computation. Left to itself, TensorFlow differentiates the
    compiled forward by making it return every intermediate its gradient
    reads: 18 bytes per attention weight (five bfloat16 and two float32
    copies) where the softmax gradient needs the 2 of the weights.

    Only while TensorFlow traces a graph (`model.fit`, `tf.function`); eager
    calls and the JAX (already compiled) and PyTorch backends run `fn` as it
    is, and differentiate it themselves. Inside an XLA-compiled function the
    call is inlined, and differentiated with the rest (`vjp` unused). Tensor
    arguments go in `args`; Python values (flags, rates, layers) in `kwargs`,
    which are fixed when the graph is traced.

    Args:
        fn: a function of tensors built from `keras.ops` and Keras layers;
            it may read variables (not with `vjp`: pass them as arguments).
            Draw random numbers outside it (see `dropout_noise`). With
            `vjp` it returns `(outputs, saved)`: `saved`, tensors its
            gradient needs besides the arguments.
        *args: its tensor arguments (None allowed).
        vjp: None, or `vjp(saved, output_grads, *args, **kwargs)` returning
            one gradient per argument (None for integer or missing ones);
            `output_grads` has the structure of `outputs`.
        **kwargs: its other arguments.

    Returns:
        What `fn` returns (with `vjp`, its `outputs`).

    Example:
    >>> y = fused(lambda x, rate: keras.ops.relu(x) * rate, keras.ops.ones((2,)), rate=0.5)  # [0.5, 0.5]
    """
    if keras.backend.backend() != "tensorflow":
        return _plain(fn, args, kwargs, vjp)
    import tensorflow as tf

    if tf.executing_eagerly():
        return _plain(fn, args, kwargs, vjp)
    # Variables are passed by value (read, and autocast, here).
    args = [None if arg is None else tf.convert_to_tensor(arg) for arg in args]
    # A new function per trace of the caller: nothing outlives the caller's graph.
    compile = lambda f: tf.function(f, jit_compile=True, autograph=False)  # noqa: E731
    if vjp is None:
        return compile(lambda *tensors: fn(*tensors, **kwargs))(*args)
    if _in_xla_function():
        # A whole-model XLA step differentiates and fuses the chain with the
        # rest of the model; the written-out gradient made BERT's 30% slower.
        return _plain(fn, args, kwargs, vjp)
    given = [i for i, arg in enumerate(args) if arg is not None]

    def with_none(tensors):
        full = [None] * len(args)
        for i, tensor in zip(given, tensors):
            full[i] = tensor
        return full

    forward = compile(lambda *tensors: fn(*with_none(tensors), **kwargs))
    backward = compile(lambda saved, grads, *tensors: vjp(saved, grads, *with_none(tensors), **kwargs))

    @tf.custom_gradient
    def call(*tensors):
        outputs, saved = forward(*tensors)

        def grad(*output_grads):
            flat = tf.nest.flatten(outputs)
            output_grads = [tf.zeros_like(y) if g is None else g for y, g in zip(flat, output_grads)]
            output_grads = tf.nest.pack_sequence_as(outputs, output_grads)
            grads = backward(saved, output_grads, *tensors)
            return [grads[i] for i in given]

        return outputs, grad

    return call(*[args[i] for i in given])


def _plain(fn, args, kwargs, vjp):
    return fn(*args, **kwargs) if vjp is None else fn(*args, **kwargs)[0]


def sum_leading_axes(x):
    """`x` summed over every axis but the last, in float32: a bias's gradient.

    As a product with a row of ones. XLA:CPU reduces over leading axes one
    column at a time, 14 ms for a 4096 x 1024 float32 gradient on the 2-core
    CPU; the product takes 1.6 ms.

    Example:
    >>> sum_leading_axes(keras.ops.ones((2, 3, 4)))  # [6, 6, 6, 6]
    """
    rows = ops.reshape(ops.cast(x, "float32"), (-1, x.shape[-1]))
    return ops.matmul(ops.ones((1, ops.shape(rows)[0]), "float32"), rows)[0]


def dropout_noise(shape, rate, seed):
    """Random bits for `dropout` over a tensor of `shape`, or None when `rate` is 0.

    Two 16-bit numbers per int32 (low half first): `(*shape[:-1],
    ceil(shape[-1] / 2))` int32 values, half as many draws and as much memory
    as float32 uniforms (the random numbers of a GPT training step's dropout
    took ~12% of its time). Drawn outside `fused` computations on purpose:
    compiled on its own, XLA:CPU draws with ThreeFry, and a GPT training step
    took 5.5 s instead of 0.5 s. Inside a function compiled whole with XLA
    (`jit_compile=True`) it gives uniform float32 noise of `shape` instead,
    which XLA draws and uses faster than bits; `dropout` takes either.

    Args:
        shape: the shape of the tensor to drop from; the last axis static.
        rate: float in [0, 1).
        seed: a `keras.random.SeedGenerator`, an int or None.
    """
    if rate == 0:
        return None
    if _in_xla_function():
        # A whole-model XLA step draws and unpacks bits 15% slower than it draws floats.
        return keras.random.uniform(shape, seed=seed)
    shape = (*shape[:-1], (shape[-1] + 1) // 2)
    if keras.backend.backend() == "tensorflow" and isinstance(seed, keras.random.SeedGenerator):
        import tensorflow as tf

        # All 32 bits of each draw: `randint`'s reduction to a range made the
        # draws 25% slower. Keras folds its int64 seeds into int32 the same way.
        seed = tf.cast(tf.math.floormod(seed.next(), tf.int32.max - 1), "int32")
        return tf.random.stateless_uniform(shape, seed, minval=None, maxval=None, dtype="int32")
    return keras.random.randint(shape, -(2**31), 2**31 - 1, dtype="int32", seed=seed)


def _in_xla_function():
    """Whether TensorFlow is tracing a `jit_compile=True` function."""
    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    return not tf.executing_eagerly() and control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def dropout(x, noise, rate):
    """Inverted dropout with `dropout_noise` bits: `x / (1 - rate)` where kept, else 0.

    Each element is kept where its 16-bit number is at least `rate * 65536`,
    rounded: `rate` to within 1/131072 of what `keras.random.dropout` uses;
    with float noise, where the noise is at least `rate`, as there.

    Args:
        x: the tensor to drop from.
        noise: `dropout_noise(x.shape, rate, seed)`, or None (no dropout).
        rate: float in [0, 1), the `rate` the noise was drawn for.

    Example:
    >>> bits = keras.ops.array([[0x0001FFFF]], "int32")  # 16-bit numbers 65535 and 1
    >>> dropout(keras.ops.ones((1, 2)), bits, 0.5)  # [[2, 0]]
    """
    if noise is None:
        return x
    if keras.backend.standardize_dtype(noise.dtype) == "int32":
        numbers = ops.stack([ops.bitwise_and(noise, 0xFFFF), ops.bitwise_and(ops.right_shift(noise, 16), 0xFFFF)], -1)
        numbers = ops.reshape(numbers, (*ops.shape(noise)[:-1], -1))
        # An odd last axis has one number too many; its length may be known
        # only at run time (variable-length batches), so slice by the tensor's.
        numbers = numbers[..., : ops.shape(x)[-1]]
        kept = ops.greater_equal(numbers, round(rate * 65536))
    else:  # uniform floats
        kept = ops.greater_equal(noise, rate)
    return x * ops.cast(kept, x.dtype) * ops.cast(1.0 / (1.0 - rate), x.dtype)
