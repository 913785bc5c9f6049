"""kzoo.logs: quiet unless TF_CPP_MIN_LOG_LEVEL is set; set, the lines at import follow it; `quiet` hides the rest.

The recipes' output with and without `--verbose` is tested in tests/recipes/test_gpt_lm.py.
"""

import os
import subprocess
import sys
import warnings
from pathlib import Path

from kzoo import logs

REPOSITORY = Path(__file__).resolve().parents[1]
HEAVY = ("keras_hub", "tokenizers", "tensorflow_text", "gguf", "safetensors", "transformers", "torch")
# As TensorFlow 2.21 prints them at import on an x86 CPU machine.
IMPORT_LINES = (
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    b"I0000 00:00:1795591826.534628   10227 port.cc:153] oneDNN custom operations are on.\n"
    b"W0000 00:00:1795591826.534977   10227 cudart_stub.cc:31] a warning\n"
    b"/path/module.py:3: UserWarning: a Python warning\n"
    b"E0000 00:00:1795591828.423523   10227 cuda_platform.cc:52] failed call to cuInit\n"
)


def test_log_lines_below_the_level_go_and_everything_else_stays():
    lines = IMPORT_LINES.splitlines(keepends=True)
    assert logs._without_log_lines(IMPORT_LINES, 1) == b"".join(lines[2:])
    assert logs._without_log_lines(IMPORT_LINES, 3) == lines[3]
    assert logs._without_log_lines(IMPORT_LINES, 0) == IMPORT_LINES


def test_import_kzoo_follows_the_level_also_for_tensorflows_first_lines():
    """TensorFlow prints INFO lines at import whatever TF_CPP_MIN_LOG_LEVEL says; through kzoo, none."""

    def stderr(level):
        environment = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
        environment.update(TF_CPP_MIN_LOG_LEVEL=level, PYTHONPATH=str(REPOSITORY))
        command = [sys.executable, "-c", "import kzoo"]
        return subprocess.run(command, capture_output=True, env=environment, timeout=300, check=True).stderr

    assert stderr("3") == b""
    assert logs._LOG_LINE.match(stderr("0").splitlines()[1])  # after absl's preamble line


def test_quiet_ignores_the_noisy_warnings_and_verbose_changes_nothing():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logs.quiet(verbose=True)
        warnings.warn("You are using a softmax over axis -1 of a tensor of shape (1, 1)", UserWarning)
        logs.quiet()
        warnings.warn("You are using a softmax over axis -1 of a tensor of shape (1, 1)", UserWarning)
        warnings.warn("a warning that says something", UserWarning)
    assert [str(warning.message)[:18] for warning in caught] == ["You are using a so", "a warning that say"]


# A script that calls `quiet`: TensorFlow runs an op (a host without a GPU logs a failed cuInit
# then); LiteRT allocates a model (it logs its CPU delegate) and compiles one (it logs then, and
# at exit); C code writes inside `captured_stderr`, then fails there; the program ends with an
# error of its own.
_CHILD = """
import os
import kzoo
import tensorflow as tf
from kzoo import logs
logs.quiet()
print(float(tf.constant(2.0) * 2))
converter = tf.lite.TFLiteConverter.from_concrete_functions(
    [tf.function(lambda x: x * 2, input_signature=[tf.TensorSpec([1], tf.float32)]).get_concrete_function()],
    tf.Module(),
)
from ai_edge_litert.interpreter import Interpreter
from ai_edge_litert.compiled_model import CompiledModel
with logs.captured_stderr():
    flatbuffer = converter.convert()
    Interpreter(model_content=flatbuffer).allocate_tensors()
    CompiledModel.from_buffer(flatbuffer).create_input_buffer_by_name("serving_default", "x")
    os.write(2, b"dropped\\n")
try:
    with logs.captured_stderr():
        os.write(2, b"what the failing call wrote\\n")
        raise RuntimeError("a real error")
except RuntimeError:
    pass
raise SystemExit("the program's own error")
"""


def run(level=None):
    environment = {name: value for name, value in os.environ.items() if name != "TF_CPP_MIN_LOG_LEVEL"}
    environment["PYTHONPATH"] = str(REPOSITORY)
    if level is not None:
        environment["TF_CPP_MIN_LOG_LEVEL"] = level
    result = subprocess.run(
        [sys.executable, "-c", _CHILD], env=environment, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 1 and result.stdout == "4.0\n"
    return result.stderr


def test_quiet_unless_the_level_is_set():
    # Only what a failing block wrote, and the program's own error.
    assert run() == "what the failing call wrote\nthe program's own error\n"
    verbose = run("0")
    for line in ("Created TensorFlow Lite XNNPACK delegate for CPU", "DestroyAccelerator", "dropped", "own error"):
        assert line in verbose


def test_import_kzoo_leaves_the_process_as_it_was():
    """No exit handler that silences the process (a user's handler registered before the import
    still prints at exit, and so does an error at interpreter shutdown), no XLA option added
    until kzoo compiles a generation loop, and no tokenizer, checkpoint or reference library
    loaded (`HEAVY`: they load where a tokenizer, a checkpoint or an export first needs them)."""
    child = """
import atexit, os, sys
atexit.register(lambda: print("the user's exit handler", file=sys.stderr))
flags = os.environ.get("XLA_FLAGS")
import kzoo
from kzoo import config
heavy = [m for m in HEAVY if m in sys.modules]
assert not heavy, f"import kzoo loaded {heavy}"
assert os.environ.get("XLA_FLAGS") == flags, os.environ.get("XLA_FLAGS")
model = kzoo.models.GPTCausalLM(kzoo.models.GPTBackbone(
    vocabulary_size=8, num_layers=1, num_heads=1, hidden_dim=4, intermediate_dim=8, max_sequence_length=8))
model.generate([[1, 2]], max_length=4)
assert all(f"--{name}={value}" in os.environ["XLA_FLAGS"] for name, value in config.XLA_FLAGS.items())
class Late:
    def __del__(self):
        print("at shutdown", file=sys.stderr)
sys.modules["late"] = Late()
"""
    environment = {
        name: value for name, value in os.environ.items() if name not in ("TF_CPP_MIN_LOG_LEVEL", "XLA_FLAGS")
    }
    environment["PYTHONPATH"] = str(REPOSITORY)
    child = f"HEAVY = {HEAVY!r}\n{child}"
    result = subprocess.run([sys.executable, "-c", child], env=environment, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the user's exit handler" in result.stderr and "at shutdown" in result.stderr
