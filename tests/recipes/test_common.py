"""recipes/_common.py's helpers that the recipe runs do not test on their own."""

import warnings

import _common
import keras
import numpy as np
import tensorflow as tf


def test_validation_data_of_unknown_length_gets_its_length_and_no_warning():
    """On a dataset of unknown length (filtered, bucketed), Keras' evaluation warns that the input
    "ran out of data"; counted once, the same batches evaluate without it, to the same loss."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(loss="mse")
    data = tf.data.Dataset.from_tensor_slices((np.ones((10, 2)), np.arange(10.0))).filter(lambda x, y: y != 3).batch(4)
    assert data.cardinality() == tf.data.UNKNOWN_CARDINALITY
    known = _common.with_known_length(data)
    assert known.cardinality() == 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = model.evaluate(data, verbose=0)
        assert any("ran out of data" in str(warning.message) for warning in caught)
        del caught[:]
        assert model.evaluate(known, verbose=0) == loss
        assert not any("ran out of data" in str(warning.message) for warning in caught)
