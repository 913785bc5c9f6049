"""kzoo.config.compilation_cache: XLA's compiled code kept between processes, per TensorFlow and CPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kzoo import config

REPOSITORY = Path(__file__).resolve().parents[1]


def test_the_folder_is_named_for_the_tensorflow_version_and_the_cpu_features():
    environ = {"KZOO_COMPILATION_CACHE": "/cache"}
    folder = config.compilation_cache(environ, "2.21.0", ["fma", "avx2"])
    assert folder.startswith("/cache/tensorflow-2.21.0-cpu-")
    assert config.compilation_cache(environ, "2.21.0", ["avx2", "fma", "avx2"]) == folder  # a set of features
    assert config.compilation_cache(environ, "2.21.0", ["avx2", "fma", "avx512f"]) != folder
    assert config.compilation_cache(environ, "2.22.0", ["fma", "avx2"]) != folder
    assert config.compilation_cache({"KZOO_COMPILATION_CACHE": "~/c"}, "2.21.0", []).startswith(os.path.expanduser("~"))


def test_jax_has_a_folder_of_its_own_and_pytorch_none():
    environ = {"KZOO_COMPILATION_CACHE": "/cache"}
    tensorflow = config.compilation_cache(environ, "2.21.0", ["fma", "avx2"], "tensorflow")
    jax = config.compilation_cache(environ, "0.10.2", ["fma", "avx2"], "jax")
    assert jax == "/cache/jax-0.10.2-cpu-" + tensorflow.rsplit("-", 1)[1]
    assert config.compilation_cache(environ, "2.13.0", ["fma", "avx2"], "torch") is None


@pytest.mark.parametrize("value", [None, ""])
def test_without_a_folder_there_is_no_cache(value):
    environ = {"TF_XLA_FLAGS": "--tf_xla_auto_jit=1"}
    if value is not None:
        environ["KZOO_COMPILATION_CACHE"] = value
    assert config.compilation_cache(environ) is None
    config.use_compilation_cache(environ)
    assert environ["TF_XLA_FLAGS"] == "--tf_xla_auto_jit=1"


def test_the_folder_joins_tf_xla_flags_unless_they_name_one():
    environ = {"KZOO_COMPILATION_CACHE": "/cache", "TF_XLA_FLAGS": "--tf_xla_auto_jit=1"}
    config.use_compilation_cache(environ)
    flags = environ["TF_XLA_FLAGS"].split()
    assert flags == ["--tf_xla_auto_jit=1", f"--tf_xla_persistent_cache_directory={config.compilation_cache(environ)}"]
    config.use_compilation_cache(environ)  # once only
    assert environ["TF_XLA_FLAGS"].split() == flags
    own = {"KZOO_COMPILATION_CACHE": "/cache", "TF_XLA_FLAGS": "--tf_xla_persistent_cache_directory=/mine"}
    config.use_compilation_cache(own)
    assert own["TF_XLA_FLAGS"] == "--tf_xla_persistent_cache_directory=/mine"


# A seeded tiny GPT's greedy tokens, compiled with XLA; TensorFlow's executable persistor logs
# (at verbosity 3) each executable it loads from the cache.
CHILD = """
import json, keras, kzoo
keras.utils.set_random_seed(0)
lm = kzoo.models.GPTCausalLM(kzoo.models.GPTBackbone(
    vocabulary_size=32, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=16))
print(json.dumps([[int(t) for t in row] for row in lm.generate([[1, 2, 3]], max_new_tokens=5)]))
"""


@pytest.mark.e2e
def test_a_second_process_loads_the_compiled_loop_instead_of_compiling_it(tmp_path):
    environment = {name: value for name, value in os.environ.items() if name not in ("TF_XLA_FLAGS", "XLA_FLAGS")}
    environment.update(
        KZOO_COMPILATION_CACHE=str(tmp_path),
        PYTHONPATH=str(REPOSITORY),
        TF_CPP_MIN_LOG_LEVEL="0",
        TF_CPP_VMODULE="device_executable_persistor=3",
    )

    def run():
        result = subprocess.run([sys.executable, "-c", CHILD], env=environment, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-3000:]
        files = {path: path.stat().st_mtime_ns for path in tmp_path.rglob("*") if path.is_file()}
        return json.loads(result.stdout.strip().splitlines()[-1]), "Loading cached entry" in result.stderr, files

    tokens, loaded, files = run()
    assert not loaded and files
    (folder,) = {path.parent for path in files}
    assert folder.name.startswith("tensorflow-") and folder.parent == tmp_path
    tokens_again, loaded_again, files_again = run()
    assert loaded_again and tokens_again == tokens
    assert files_again == files  # read, not written again
