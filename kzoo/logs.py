"""Quiet by default: a script's output is its own, not TensorFlow's logs.

TensorFlow's C++ side prints log lines (oneDNN, CUDA, XLA) down to the level of the environment
variable `TF_CPP_MIN_LOG_LEVEL` (0: all, 1: no INFO, 2: no WARNING, 3: no ERROR), which it reads
once, when it is imported, and it prints its first INFO lines during the import, before it
reads it. `import_tensorflow` applies the level to those too. TensorFlow's Python side and
tensorflow-datasets log through the `tensorflow` and `absl` loggers.

This module imports only the standard library (TensorFlow when asked), so that `kzoo/__init__.py`
imports TensorFlow through it.
"""

import contextlib
import logging
import os
import re
import sys
import tempfile
import warnings

# Python warnings that report no problem of the user's run.
NOISY_WARNINGS = (
    # Attention over one key (a one-token prompt, a one-position cache) is a real case, not a mistake.
    (UserWarning, "You are using a softmax over axis -1 of a tensor of shape"),
    # A BERT task that reads no pooled output (masked LM, tagger) leaves BERT's pooler untrained.
    (UserWarning, "Gradients do not exist for variables ['pooler/kernel', 'pooler/bias']"),
    # Keras' TensorFlow backend passes copy=False to np.array on tensors (NumPy 2).
    (DeprecationWarning, "__array__ implementation doesn't accept a copy keyword"),
)
# A line of TensorFlow's C++ log: "I0000 00:00:1795591826.534628   10227 port.cc:153] ...".
_LOG_LINE = re.compile(rb"^([IWEF])\d{4} [\d:.]+ +\d+ [^ \]]+:\d+\] ")
_LEVELS = {b"I": 0, b"W": 1, b"E": 2, b"F": 3}
# What absl prints before the first of those lines, until TensorFlow has set its logging up.
_ABSL_PREAMBLE = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"


def quiet(verbose=False):
    """Hides TensorFlow's logs and known noisy warnings, for a script whose output is its own.

    Unless `verbose`: sets `TF_CPP_MIN_LOG_LEVEL` to 3 (no C++ log lines) where the user has
    not set it, sets the `tensorflow` and `absl` Python loggers to ERROR (retracing notes,
    tensorflow-datasets' notes) and ignores `NOISY_WARNINGS`. With `verbose`, it changes nothing.

    TensorFlow reads the level when it is imported, and `import kzoo` imports it: a script that
    wants the C++ lines gone too sets the level first, before its imports, e.g.
    `os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")` (as `recipes/_common.py` does unless
    `--verbose`), then calls `quiet`.

    Args:
        verbose: bool; True leaves every log and warning as it is.
    """
    if verbose:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    for name in ("tensorflow", "absl"):
        logging.getLogger(name).setLevel(logging.ERROR)
    for category, message in NOISY_WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(message), category=category)


def import_tensorflow():
    """Imports TensorFlow; the C++ log lines it prints during the import follow
    `TF_CPP_MIN_LOG_LEVEL`, as its later lines do.

    While TensorFlow imports, the process's standard error (file descriptor 2, where C++
    writes) goes to a temporary file; then whatever is not a log line below the level (a
    Python warning, an error) goes on to standard error, everything if the import fails.
    """
    if "tensorflow" in sys.modules:
        return
    level = _min_log_level()
    if level == 0:
        import tensorflow  # noqa: F401

        return
    sys.stderr.flush()
    with tempfile.TemporaryFile() as held:
        saved = os.dup(2)
        os.dup2(held.fileno(), 2)
        failed = True
        try:
            import tensorflow  # noqa: F401

            failed = False
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = held.read() if failed else _without_log_lines(held.read(), level)
            with contextlib.suppress(OSError):
                os.write(2, text)


def _min_log_level():
    try:
        return min(max(int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0")), 0), 3)
    except ValueError:
        return 0


def _without_log_lines(text, level):
    """`text` without TensorFlow's C++ log lines below `level` (and absl's preamble to them)."""
    kept = []
    for line in text.splitlines(keepends=True):
        match = _LOG_LINE.match(line)
        if (line == _ABSL_PREAMBLE and level > 0) or (match and _LEVELS[match.group(1)] < level):
            continue
        kept.append(line)
    return b"".join(kept)
