"""Under JAX, kzoo's layers, models, samplers and Hugging Face loader run where TensorFlow is not
installed: each test runs a fresh process whose imports of TensorFlow (and of keras-hub,
tensorflow-text and gguf, which a GPU machine without TensorFlow lacks too) fail as they would
there."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from kzoo.checkpoints.families import TINY_BASE
from kzoo.config import keras_backend
from tests.models import hf_folders

pytest.importorskip("jax")

# Put first in a child process: from then on an import of these packages fails as if they were not
# installed. torch._dynamo is imported before: as it loads it asks `importlib.util.find_spec` where
# optional libraries (TensorFlow among them) live, which a finder that refuses them breaks, while
# an absent library only answers None.
REFUSE_TENSORFLOW = textwrap.dedent(
    """
    import importlib.abc, sys
    try:
        import torch._dynamo
    except ImportError:
        pass

    class RefuseTensorFlow(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("tensorflow", "tensorflow_text", "keras_hub", "gguf", "tf_keras"):
                raise ModuleNotFoundError(f"No module named {name!r} (refused by the test)", name=name)
            return None

    sys.meta_path.insert(0, RefuseTensorFlow())
    """
)


def run_without_tensorflow(script, timeout=300):
    """Runs `script` under JAX, TensorFlow refused; returns its standard output."""
    env = dict(os.environ, KERAS_BACKEND="jax")
    result = subprocess.run(
        [sys.executable, "-c", REFUSE_TENSORFLOW + textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    return result.stdout


def test_keras_backend_is_read_as_keras_reads_it_before_keras_is_imported(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "keras")
    home = {"KERAS_HOME": str(tmp_path)}
    assert keras_backend(home) == "tensorflow"
    (tmp_path / "keras.json").write_text('{"backend": "torch"}')
    assert keras_backend(home) == "torch"
    assert keras_backend({**home, "KERAS_BACKEND": "jax"}) == "jax"
    assert keras_backend({**home, "KERAS_BACKEND": ""}) == "torch"


@pytest.mark.e2e  # a fresh process under JAX, about a minute on 2 cores
def test_a_hugging_face_decoder_loads_runs_and_generates_under_jax_without_tensorflow(tmp_path):
    folder, out = tmp_path / "qwen2", tmp_path / "out.npz"
    reference = hf_folders.write_decoder(folder, "qwen2")
    ids = np.random.default_rng(0).integers(1, TINY_BASE["vocab_size"], (2, 7)).astype("int32")
    run_without_tensorflow(
        f"""
        import numpy as np
        import keras
        import kzoo

        assert keras.backend.backend() == "jax"
        ids = np.array({ids.tolist()}, "int32")
        inputs = {{"token_ids": ids, "padding_mask": np.ones_like(ids)}}
        # A Hugging Face folder: its weights alone (its tokenizer is keras-hub's, which needs TensorFlow).
        lm = kzoo.models.CausalLM.from_preset({str(folder)!r}, tokenizer=None)
        logits = np.asarray(lm(inputs))
        tokens = lm.generate(ids.tolist(), max_new_tokens=8)
        assert "tensorflow" not in sys.modules
        np.savez({str(out)!r}, logits=logits, tokens=tokens)
        """
    )
    result = np.load(out)
    import torch

    with torch.no_grad():
        want = reference(torch.from_numpy(ids).long()).logits.numpy()
        want_tokens = reference.generate(
            torch.from_numpy(ids).long(), max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0
        ).numpy()
    np.testing.assert_allclose(result["logits"], want, atol=1e-4)
    np.testing.assert_array_equal(result["tokens"], want_tokens)


@pytest.mark.e2e
def test_gpu_check_runs_without_tensorflow_or_keras_hub():
    output = run_without_tensorflow(
        """
        import runpy
        runpy.run_module("benchmarks.gpu_check", run_name="__main__")
        """
    )
    lines = output.strip().splitlines()
    assert len(lines) == 3 and all(" ok " in line for line in lines), output
