"""Arrays handed to variables without a copy (`kzoo.checkpoints.arrays`), and the loader's use of them."""

import gc
import types

import keras
import numpy as np
import pytest

from kzoo import _compat
from kzoo.checkpoints import arrays
from kzoo.checkpoints.hf import load as hf_load
from kzoo.checkpoints.tensor_maps import TensorMap


@pytest.mark.parametrize("shape", [(3,), (7, 5), (2, 3, 4)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "uint8"])
def test_empty_is_aligned_and_contiguous(shape, dtype):
    for _ in range(5):  # NumPy's own allocations land on 16-byte boundaries, mostly not on 64
        array = arrays.empty(shape, dtype)
        assert array.shape == shape and array.dtype == dtype and array.flags.c_contiguous
        assert array.ctypes.data % arrays.ALIGNMENT == 0
    assert arrays.empty((0, 3), dtype).shape == (0, 3)


def test_copy_is_an_aligned_copy():
    source = np.arange(12, dtype="float64").reshape(3, 4).T
    copied = arrays.copy(source, "float32")
    np.testing.assert_array_equal(copied, source)
    assert copied.dtype == "float32" and arrays.shareable(copied) and not np.may_share_memory(copied, source)


def test_only_aligned_contiguous_writable_floats_are_shareable():
    array = arrays.copy(np.ones((4, 16), "float32"))
    assert arrays.shareable(array)
    assert not arrays.shareable(array[:, 1:])  # not contiguous
    assert not arrays.shareable(array.reshape(-1)[1:])  # contiguous, not aligned
    assert not arrays.shareable(array.astype("float64"))
    assert not arrays.shareable(arrays.empty((0,)))
    array.flags.writeable = False
    assert not arrays.shareable(array)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow's variables adopt the memory")
def test_a_new_variable_adopts_a_shareable_array_without_copying():
    array = arrays.copy(np.arange(64 * 33, dtype="float32").reshape(64, 33))
    expected = array.copy()
    with _compat.deferred_variables():
        variable = keras.Variable(initializer="zeros", shape=array.shape, dtype="float32")
    _compat.set_variable(variable, arrays.variable_value(array))
    array[0, 0] = -1.0  # seen through the variable: the same memory
    assert float(variable[0, 0]) == -1.0
    del array
    gc.collect()  # the variable keeps the memory alive once NumPy lets go of it
    expected[0, 0] = -1.0
    np.testing.assert_array_equal(variable.numpy(), expected)
    variable.assign(variable + 1)
    np.testing.assert_array_equal(variable.numpy(), expected + 1)


def test_an_unshareable_array_is_given_as_it_is():
    array = np.ones((3, 5), "float64")
    assert arrays.variable_value(array) is array


class _Reader:
    def __init__(self, tensors):
        self.tensors = tensors

    def names(self):
        return set(self.tensors)

    def shape(self, name):
        return self.tensors[name].shape

    def dtype(self, name):
        return "F32"

    def sources(self):
        return ["memory"]

    def read(self, name, order="C"):
        return arrays.copy(self.tensors[name])


def test_two_variables_a_map_gives_the_same_array_get_memory_of_their_own():
    value = np.arange(32 * 16, dtype="float32").reshape(32, 16)
    with _compat.deferred_variables():
        first, second = (keras.Variable(initializer="zeros", shape=value.shape, dtype="float32") for _ in range(2))
    map_ = TensorMap((first, second), ("w",), lambda values: [values[0], values[0]], lambda values: values[:1])
    family = types.SimpleNamespace(
        prefixes=("",), optional_prefixes=(), ignored=(), ignored_prefixes=(), backbone_prefix=""
    )
    hf_load._load_weights([map_], [], _Reader({"w": value}), family, None, "memory")
    first.assign(first + 1)
    np.testing.assert_array_equal(first.numpy(), value + 1)
    np.testing.assert_array_equal(second.numpy(), value)


@pytest.mark.parametrize(
    "values, finite",
    [
        ([1.0, -2.0], True),
        ([1.0, np.nan], False),
        ([np.inf, 1.0], False),
        ([np.inf, -np.inf], False),
        ([3e38, 3e38], True),
    ],  # fmt: skip
)
def test_the_loaders_finite_check(values, finite):
    """A NaN or infinity anywhere is found; finite values whose sum overflows are finite."""
    array = np.zeros((64, 64), "float32")
    array.flat[[5, 3000]] = values
    assert hf_load._all_finite(array) is finite
    assert hf_load._all_finite(array.T) is finite
