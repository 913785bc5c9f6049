"""Dropout from drawn noise: the noise is drawn once and passed to whatever applies it.

A fused op and its reference implementation drop the same entries when given
the same noise, and a written-out gradient drops the gradient where the
forward pass dropped the value.
"""

import keras
from keras import ops

from kzoo.ops._fusion import execution_mode


def dropout_noise(shape, rate, seed):
    """Random bits for `dropout` over a tensor of `shape`, or None when `rate` is 0.

    Two 16-bit numbers per int32 (low half first): `(*shape[:-1],
    ceil(shape[-1] / 2))` int32 values, half as many draws and as much memory
    as float32 uniforms. Inside a function compiled whole with XLA
    (`jit_compile=True`) it gives uniform float32 noise of `shape` instead,
    which XLA draws and uses faster than bits; `dropout` takes either. Draw
    it outside the fused computations (the fused ops do): compiled on its
    own, XLA:CPU draws with ThreeFry, many times slower than TensorFlow's
    own random kernels.

    Args:
        shape: the shape of the tensor to drop from; the last axis static.
        rate: float in [0, 1).
        seed: a `keras.random.SeedGenerator`, an int or None.

    Example:
    >>> tuple(dropout_noise((2, 5), 0.1, seed=1).shape)  # two 16-bit numbers per int32
    (2, 3)
    """
    if rate == 0:
        return None
    if execution_mode() == "xla":
        return keras.random.uniform(shape, seed=seed)
    shape = (*shape[:-1], (shape[-1] + 1) // 2)
    if keras.backend.backend() == "tensorflow" and isinstance(seed, keras.random.SeedGenerator):
        import tensorflow as tf

        # All 32 bits of each draw: `randint`'s reduction to a range costs a
        # quarter more. Keras folds its int64 seeds into int32 the same way.
        seed = tf.cast(tf.math.floormod(seed.next(), tf.int32.max - 1), "int32")
        return tf.random.stateless_uniform(shape, seed, minval=None, maxval=None, dtype="int32")
    return keras.random.randint(shape, -(2**31), 2**31 - 1, dtype="int32", seed=seed)


def training_noise(shape, rate, seed, training):
    """`dropout_noise(shape, rate, seed)` when `training`, else None (no dropout)."""
    return dropout_noise(shape, rate, seed) if training else None


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
    >>> keras.ops.convert_to_numpy(dropout(keras.ops.ones((1, 2)), bits, 0.5)).tolist()
    [[2.0, 0.0]]
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
