"""`.keras` files written by earlier kzoo code still load, with the same outputs and optimizer state.

The files under `data/saved_models` were written by `data/make_saved_models.py`
before the layers' weights and dropout seeds changed hands; every model class
(and a model of every public layer) is there, compiled and trained one step.
"""

import os
import warnings

import keras
import numpy as np
import pytest

import kzoo  # noqa: F401  (registers the classes the files name)

DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "saved_models")
NAMES = sorted(name[: -len(".keras")] for name in os.listdir(DIRECTORY) if name.endswith(".keras"))


def test_every_model_class_has_a_saved_file():
    assert {
        "gpt_causal_lm",
        "bert_masked_lm",
        "bert_classifier",
        "bert_token_classifier",
        "seq2seq_transformer",
        "bilstm_classifier",
        "bilstm_tagger",
        "rnn_language_model",
        "feed_forward_language_model",
        "layers",
    } <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_an_old_file_loads_with_its_outputs_and_optimizer_state(name):
    saved = np.load(os.path.join(DIRECTORY, f"{name}.npz"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = keras.saving.load_model(os.path.join(DIRECTORY, f"{name}.keras"))
    # Keras warns, and loads nothing, for a layer whose stored variables do not match.
    assert not [str(w.message) for w in caught if "load" in str(w.message)]
    inputs = {key[len("input/") :]: saved[key] for key in saved.files if key.startswith("input/")}
    outputs = model(inputs["inputs"] if list(inputs) == ["inputs"] else inputs)
    # Float32 round-off only: the files were written on another CPU, and TensorFlow sums in
    # another order where oneDNN or AVX-512 kernels run. Two same-shaped kernels swapped on
    # loading move these files' outputs by 2e-4 or more, far above the bound.
    np.testing.assert_allclose(keras.ops.convert_to_numpy(outputs), saved["output"], rtol=1e-5, atol=1e-5)
    # Each optimizer slot comes back to the variable it belongs to (slots load by position).
    slots = {f"optimizer/{variable.path}": variable for variable in model.optimizer.variables}
    assert set(slots) == {key for key in saved.files if key.startswith("optimizer/")}
    for key, variable in slots.items():
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), saved[key], err_msg=key)
