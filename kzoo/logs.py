"""Keeps TensorFlow's and LiteRT's own log lines out of the terminal, so that kzoo's output is its own.

TensorFlow's libraries log as they load (oneDNN, CUDA drivers) and when they first run (a failed
`cuInit` on a host without a GPU, the CPU instructions it was built for); LiteRT logs when it
creates its CPU delegate or a compiled model, and when it frees a process-wide environment as the
process exits. `import kzoo` calls `quiet()` first, before it imports Keras and TensorFlow: those
lines are dropped, unless the import fails, when they are shown with the error; kzoo wraps the
calls that log later in `captured_stderr`; and what C++ code writes after Python has finished
exiting goes nowhere.

The usual variable brings them back: with `TF_CPP_MIN_LOG_LEVEL` set (by the user, or by a
script's `--verbose`, before it imports kzoo), kzoo leaves TensorFlow's logging as that value
says and captures nothing.

This module imports only the standard library.
"""

import atexit
import contextlib
import os
import sys
import tempfile

LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"
_quiet = False


def quiet(verbose=False):
    """Imports Keras (and so TensorFlow) without their log lines, and makes `captured_stderr`
    capture. Does nothing when `verbose` is true, when `TF_CPP_MIN_LOG_LEVEL` is set, or once
    done; call it before TensorFlow is imported (`import kzoo` does).

    Example:
    >>> quiet()  # what `import kzoo` did already
    >>> import keras  # no log lines
    """
    global _quiet
    if verbose or LEVEL_VARIABLE in os.environ:
        return
    _quiet = True
    # Registered before Keras and TensorFlow register theirs, so that it runs after them.
    atexit.register(_drop_stderr)
    if "tensorflow" in sys.modules:  # imported before kzoo: its lines are out already
        return
    # TensorFlow reads the level as it loads; set for the import only, so that child processes
    # (which quiet themselves) do not take it for the user's.
    os.environ[LEVEL_VARIABLE] = "3"
    try:
        with captured_stderr():
            import keras  # noqa: F401  (its backend, TensorFlow, logs as its libraries load)
    finally:
        del os.environ[LEVEL_VARIABLE]


@contextlib.contextmanager
def captured_stderr():
    """While the block runs, what is written to the process's stderr (file descriptor 2: C and
    C++ code, Python's own writes too) goes to a temporary file, which is dropped, or written out
    after all when the block raises, so that a real error still shows. Captures nothing unless
    `quiet()` made this process quiet."""
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
