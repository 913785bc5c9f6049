"""kzoo.logs: TensorFlow's lines at import follow TF_CPP_MIN_LOG_LEVEL, and `quiet` hides the rest.

The recipes' output with and without `--verbose` is tested in tests/recipes/test_gpt_lm.py.
"""

import os
import subprocess
import sys
import warnings
from pathlib import Path

from kzoo import logs

REPOSITORY = Path(__file__).resolve().parents[1]
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
