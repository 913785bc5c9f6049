"""Small helpers of the model tests: padding, gradients, repeated batches."""

import keras
import numpy as np
import tensorflow as tf


def pad(ids, extra):
    """`ids` `(B, T)` with `extra` more padding (id 0) on the right."""
    return np.pad(ids, ((0, 0), (0, extra)))


def dense(gradient):
    """A gradient as a NumPy array; embedding lookups give `IndexedSlices`."""
    return keras.ops.convert_to_numpy(tf.convert_to_tensor(gradient))


def repeated(batch, times=100):
    """`batch` (arrays or a dict of arrays) stacked `times` times: one `fit`
    epoch of `times` steps on it, with a single trace of the train step
    (tracing, not the steps, is what costs time here)."""
    return keras.tree.map_structure(lambda array: np.concatenate([array] * times), batch)
