"""Reloading saved models in a fresh interpreter and comparing their outputs."""

import json
import os
import subprocess
import sys

import keras
import numpy as np

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The fresh interpreter imports nothing but kzoo, so the models can only come
# from the saved files and what `import kzoo` registers.
_LOAD_SCRIPT = """
import json, sys
import numpy as np
import keras
import kzoo

directory = sys.argv[1]
types = {}
for name in json.load(open(f"{directory}/names.json")):
    model = keras.saving.load_model(f"{directory}/{name}.keras")
    inputs = dict(np.load(f"{directory}/{name}_inputs.npz"))
    outputs = model(inputs["inputs"] if list(inputs) == ["inputs"] else inputs)
    outputs = outputs if isinstance(outputs, dict) else {"outputs": outputs}
    np.savez(f"{directory}/{name}_loaded.npz", **keras.tree.map_structure(np.asarray, outputs))
    types[name] = type(model).__name__
json.dump(types, open(f"{directory}/types.json", "w"))
"""


def _as_dict(value, key):
    return value if isinstance(value, dict) else {key: value}


def assert_reload_in_fresh_process(directory, models):
    """Saves `{name: (model, inputs)}` to `.keras` files, reloads them in a new
    Python process and checks the class and the outputs (exactly)."""
    for name, (model, inputs) in models.items():
        model.save(directory / f"{name}.keras")
        np.savez(directory / f"{name}_inputs.npz", **_as_dict(inputs, "inputs"))
    (directory / "names.json").write_text(json.dumps(list(models)))
    subprocess.run(
        [sys.executable, "-c", _LOAD_SCRIPT, str(directory)],
        check=True,
        cwd=REPOSITORY,
        env={**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"},
        timeout=300,
    )
    types = json.loads((directory / "types.json").read_text())
    for name, (model, inputs) in models.items():
        assert types[name] == type(model).__name__
        loaded = np.load(directory / f"{name}_loaded.npz")
        for key, expected in _as_dict(model(inputs), "outputs").items():
            np.testing.assert_array_equal(loaded[key], keras.ops.convert_to_numpy(expected), err_msg=f"{name}: {key}")
