"""`import kzoo` keeps TensorFlow's and LiteRT's log lines out of the terminal; TF_CPP_MIN_LOG_LEVEL undoes it."""

import os
import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]

# TensorFlow runs an op (a host without a GPU logs a failed cuInit then); LiteRT allocates a
# model (it logs its CPU delegate) and compiles one (it logs then, and at exit); C code writes
# inside `captured_stderr`, then fails there; the program ends with an error of its own.
_CHILD = """
import os
import kzoo
import tensorflow as tf
from kzoo import logs
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
