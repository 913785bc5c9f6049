"""Quiet by default: a script's output is its own, not TensorFlow's or LiteRT's logs.

TensorFlow's libraries log as they load (oneDNN, CUDA drivers) and when they first run (a failed
`cuInit` on a host without a GPU, the CPU instructions it was built for), down to the level of
the environment variable `TF_CPP_MIN_LOG_LEVEL` (0: all, 1: no INFO, 2: no WARNING, 3: no
ERROR), which it reads once, as it loads; and it prints its first INFO lines before it reads it.
LiteRT logs when it creates its CPU delegate or a compiled model, and when it frees a
process-wide environment as the process exits. TensorFlow's Python side and tensorflow-datasets
log through the `tensorflow` and `absl` loggers.

`import kzoo` calls `import_tensorflow` first. Where `TF_CPP_MIN_LOG_LEVEL` is not set, kzoo is
quiet: those lines are dropped (unless the import fails: then they are shown with the error), and
`captured_stderr` drops what the runtime calls that log write. Where it is set (by the user, or by
a script's `--verbose`, before it imports kzoo), TensorFlow's lines follow that level, the first
ones too, and nothing is captured. Nothing of this outlives the import or the call.

Scripts whose output is their own (kzoo's recipes and `export.py`) also call `quiet`: it hides the
Python loggers and known warnings, and, where kzoo is quiet, sends what C++ code writes once the
process exits (LiteRT's log of the environment it frees) nowhere. A library user's process keeps
its standard error to the end.

This module imports only the standard library (TensorFlow when asked), so that `kzoo/__init__.py`
imports TensorFlow through it.
"""

import atexit
import contextlib
import logging
import os
import re
import sys
import tempfile
import warnings

LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"
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
_quiet = False
# Whether `quiet` has registered `_drop_stderr`.
_exit_quiet = False


def quiet(verbose=False):
    """Hides TensorFlow's Python logs and known noisy warnings, for a script whose output is its own.

    Unless `verbose`: sets the `tensorflow` and `absl` Python loggers to ERROR (retracing notes,
    tensorflow-datasets' notes), ignores `NOISY_WARNINGS` and, where kzoo is quiet, points the
    process's standard error at nothing once its exit handlers have run (those registered
    before this call run after it, so call it first thing in a script). With `verbose`, it
    changes nothing. The C++ lines at import are `import kzoo`'s to hide (see the module's
    docstring): a script whose `--verbose` wants them sets `TF_CPP_MIN_LOG_LEVEL=0` before its
    imports.

    Args:
        verbose: bool; True leaves every log and warning as it is.
    """
    if verbose:
        return
    for name in ("tensorflow", "absl"):
        logging.getLogger(name).setLevel(logging.ERROR)
    for category, message in NOISY_WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(message), category=category)
    global _exit_quiet
    if _quiet and not _exit_quiet:
        _exit_quiet = True
        atexit.register(_drop_stderr)


def import_tensorflow():
    """Imports TensorFlow, quietly unless `TF_CPP_MIN_LOG_LEVEL` is set; the C++ log lines it
    prints during the import follow that level, as its later lines do.

    While TensorFlow imports, the process's standard error (file descriptor 2, where C++
    writes) goes to a temporary file; then whatever is not a log line below the level (a
    Python warning, an error) goes on to standard error, everything if the import fails.
    """
    global _quiet
    if "tensorflow" in sys.modules:
        return
    level = _min_log_level()
    if level is None:
        _quiet = True
        # TensorFlow reads the level as it loads; set for the import only, so that child
        # processes (which quiet themselves) do not take it for the user's.
        os.environ[LEVEL_VARIABLE] = "3"
        try:
            _import_tensorflow(3)
        finally:
            del os.environ[LEVEL_VARIABLE]
    elif level == 0:
        import tensorflow  # noqa: F401
    else:
        _import_tensorflow(level)


def _import_tensorflow(level):
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


@contextlib.contextmanager
def captured_stderr():
    """While the block runs, what is written to the process's stderr (file descriptor 2: C and
    C++ code, Python's own writes too) goes to a temporary file, which is dropped, or written out
    after all when the block raises, so that a real error still shows. Captures nothing unless
    kzoo is quiet (`TF_CPP_MIN_LOG_LEVEL` was not set when kzoo was imported)."""
    if not _quiet:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        except BaseException:
            sys.stderr.flush()
            os.dup2(saved, 2)
            capture.seek(0)
            sys.stderr.write(capture.read().decode("utf-8", errors="replace"))
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def _drop_stderr():
    """Points the process's stderr at nothing, once Python has run its exit handlers: only C++
    destructors write after that (LiteRT's log of the environment it frees)."""
    sys.stderr.flush()
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)


def _min_log_level():
    """`TF_CPP_MIN_LOG_LEVEL` as 0..3, or None where it is not set."""
    if LEVEL_VARIABLE not in os.environ:
        return None
    try:
        return min(max(int(os.environ[LEVEL_VARIABLE]), 0), 3)
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
