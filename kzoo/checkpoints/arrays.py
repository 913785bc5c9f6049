"""NumPy arrays that a Keras variable can take as its value without copying them.

TensorFlow copies a NumPy array twice on its way into a variable (`tf.constant` copies it, then
copies the copy into a buffer of its own unless the array starts on a multiple of 64 bytes, which
NumPy does not promise). A loader that fills a fresh array of `empty` and hands it over with
`variable_value` lets the variable adopt that memory instead: each weight is written once, and
the peak holds no second copy of the largest tensor.
"""

import math

import keras
import numpy as np

# Eigen's widest vector alignment, which TensorFlow assumes of every tensor's data: a buffer it
# wraps that is not so aligned is refused by its vectorized kernels (the process aborts).
ALIGNMENT = 64
# Dtypes NumPy and TensorFlow exchange through DLPack.
_SHAREABLE = (np.dtype("float32"), np.dtype("float16"))


def empty(shape, dtype="float32"):
    """An uninitialized C-contiguous array whose data starts on an `ALIGNMENT`-byte boundary."""
    dtype = np.dtype(dtype)
    size = math.prod(shape) * dtype.itemsize
    buffer = np.empty(size + ALIGNMENT, np.uint8)
    offset = -buffer.ctypes.data % ALIGNMENT
    return buffer[offset : offset + size].view(dtype).reshape(shape)


def copy(array, dtype=None):
    """A copy of `array` (as `dtype`) in an array of `empty`."""
    out = empty(array.shape, array.dtype if dtype is None else dtype)
    out[...] = array
    return out


def shareable(array):
    """Whether a backend tensor may use `array`'s memory as its own: an aligned, C-contiguous,
    writable float32 or float16 NumPy array."""
    return (
        isinstance(array, np.ndarray)
        and array.dtype in _SHAREABLE
        and array.size > 0
        and array.flags.c_contiguous
        and array.flags.writeable
        and array.ctypes.data % ALIGNMENT == 0
    )


def variable_value(array):
    """`array` as the value to give a variable: under TensorFlow a `shareable` array becomes a
    tensor over the same memory (DLPack, no copy), which a new variable adopts; anything else is
    returned as it is, for the backend to copy. The caller gives up `array`: writing to it later
    would change the variable."""
    if keras.backend.backend() != "tensorflow" or not shareable(array):
        return array
    import tensorflow as tf

    return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
