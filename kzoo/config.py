"""Global switches of kzoo, as `keras.config` holds Keras' own.

Fused training: kzoo's training ops (`kzoo.ops.softmax_dropout`,
`kzoo.ops.layer_norm`, `kzoo.ops.residual_dropout_layer_norm`, ...) each have
a plain `keras.ops` implementation and, under TensorFlow, a fused one: the
element-wise chain compiled as one XLA computation with its gradient written
out. The fused one runs where it helps (a training step traced into a
TensorFlow graph that is not itself compiled with XLA); everywhere else, and
always when fused training is off, the plain one runs. Both compute the same
values and gradients.
"""

import hashlib
import importlib
import json
import os
import platform
import sys

_fused_training = True

# XLA options kzoo adds before it compiles a generation loop, unless XLA_FLAGS names them already
# (XLA reads XLA_FLAGS once, at its first compilation).
XLA_FLAGS = {
    # Without copy insertion's region analysis, XLA's CPU compiler copies every KV cache of a
    # compiled generation loop twice per step (it duplicates the cache update into two fusions).
    "xla_cpu_copy_insertion_use_region_analysis": "true",
}


def add_xla_flags(environ=os.environ):
    """Appends `XLA_FLAGS`'s options to `environ["XLA_FLAGS"]`, each one it does not name yet.

    kzoo calls it before it compiles a generation loop with XLA (`generate(jit_compile=True)`,
    the default); XLA reads the variable at the first compilation of the process, so in a
    process that compiled with XLA before, the options take no effect (generation is as
    correct, only slower). Call it first thing to apply them to every compilation. To keep
    XLA's own default, name the option with its default value, e.g.
    `XLA_FLAGS=--xla_cpu_copy_insertion_use_region_analysis=false`.

    Example:
    >>> environ = {"XLA_FLAGS": "--xla_dump_to=/tmp/dump"}
    >>> add_xla_flags(environ)
    >>> environ["XLA_FLAGS"]
    '--xla_dump_to=/tmp/dump --xla_cpu_copy_insertion_use_region_analysis=true'
    """
    flags = environ.get("XLA_FLAGS", "").split()
    named = {flag.split("=")[0].lstrip("-") for flag in flags}
    flags += [f"--{name}={value}" for name, value in XLA_FLAGS.items() if name not in named]
    environ["XLA_FLAGS"] = " ".join(flags)


# Where XLA's compiled executables are kept between processes: off unless this names a folder.
COMPILATION_CACHE_VARIABLE = "KZOO_COMPILATION_CACHE"
_CACHE_FLAG = "tf_xla_persistent_cache_directory"


def compilation_cache(environ=os.environ, library_version=None, cpu_features=None, backend=None):
    """The folder of XLA's persistent compilation cache that kzoo uses, or None (the default).

    Compiling a generation loop with XLA is a large part of a fresh process's first reply. With
    `KZOO_COMPILATION_CACHE` naming a folder, XLA keeps each compiled executable there (set by
    `use_compilation_cache`: TensorFlow's `--tf_xla_persistent_cache_directory`, or JAX's
    `jax_compilation_cache_dir` under Keras' JAX backend), and a later process running the same
    function at the same shapes loads it instead of compiling it again (tracing and lowering
    to XLA still run). The executables go to a subfolder named for the library and its version
    and a digest of the CPU's features: an executable is machine code for one CPU, and one
    compiled elsewhere (AVX-512 code on an AVX2 host) or by another release is never read.

    Args:
        environ: where `KZOO_COMPILATION_CACHE` (and `KERAS_BACKEND`) is read.
        library_version, cpu_features: None for this process's TensorFlow (or JAX) and this
            host's CPU features (the `flags` of /proc/cpuinfo); given, for another's.
        backend: Keras' backend; None for the one it runs on (`keras_backend`).

    Example:
    >>> compilation_cache({"KZOO_COMPILATION_CACHE": "/tmp/xla"}, "2.21.0", ["avx2", "fma"], "tensorflow")
    '/tmp/xla/tensorflow-2.21.0-cpu-340a4556249e'
    >>> compilation_cache({"KZOO_COMPILATION_CACHE": "/tmp/xla"}, "0.10.2", ["avx2", "fma"], "jax")
    '/tmp/xla/jax-0.10.2-cpu-340a4556249e'
    >>> compilation_cache({}) is None
    True
    """
    root = environ.get(COMPILATION_CACHE_VARIABLE)
    library = backend or keras_backend(environ)
    if not root or library not in ("tensorflow", "jax"):  # PyTorch compiles no XLA
        return None
    if library_version is None:
        library_version = importlib.import_module(library).__version__
    if cpu_features is None:
        cpu_features = host_cpu_features()
    digest = hashlib.sha256(" ".join(sorted(set(cpu_features))).encode()).hexdigest()[:12]
    return os.path.join(os.path.expanduser(root), f"{library}-{library_version}-cpu-{digest}")


def use_compilation_cache(environ=os.environ):
    """Points XLA at `compilation_cache()`'s folder when `KZOO_COMPILATION_CACHE` is set.

    Under TensorFlow: adds the folder to `TF_XLA_FLAGS` unless they name a cache folder of
    their own. `import kzoo` calls it: TensorFlow reads `TF_XLA_FLAGS` once, when the process
    runs its first function, so a process that ran one before `import kzoo` keeps no cache
    (generation is as correct, only compiled again). Under JAX: sets `jax_compilation_cache_dir`
    unless the process set one (JAX keeps what takes at least
    `jax_persistent_cache_min_compile_time_secs` to compile, a second by default)."""
    backend = keras_backend(environ)
    folder = compilation_cache(environ, backend=backend)
    if folder is None:
        return
    if backend == "jax":
        import jax

        if not jax.config.jax_compilation_cache_dir:
            jax.config.update("jax_compilation_cache_dir", folder)
        return
    flags = environ.get("TF_XLA_FLAGS", "").split()
    if any(flag.lstrip("-").startswith(_CACHE_FLAG) for flag in flags):
        return
    environ["TF_XLA_FLAGS"] = " ".join([*flags, f"--{_CACHE_FLAG}={folder}"])


def host_cpu_features():
    """This host CPU's feature flags (the `flags` of Linux's /proc/cpuinfo), else its processor name."""
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].split()
    except OSError:
        pass
    return [platform.processor() or platform.machine()]


def keras_backend(environ=os.environ):
    """The backend Keras runs on (or will, once imported), found without importing Keras.

    `import keras` under TensorFlow imports TensorFlow, which `import kzoo` must import first and
    quietly (`kzoo.logs`), and under JAX or PyTorch kzoo imports no TensorFlow at all (it may not
    be installed); so kzoo asks before Keras is imported. Keras' own documented rule: a non-empty
    `KERAS_BACKEND`, else the "backend" of `keras.json` in `KERAS_HOME` (default `~/.keras`, or
    `/tmp/.keras` where the home folder is not writable), else "tensorflow". Once Keras is
    imported, its own answer.
    """
    if "keras" in sys.modules:
        return sys.modules["keras"].config.backend()
    if environ.get("KERAS_BACKEND"):
        return environ["KERAS_BACKEND"]
    home = environ.get("KERAS_HOME")
    if home is None:
        base = os.path.expanduser("~")
        home = os.path.join(base if os.access(base, os.W_OK) else "/tmp", ".keras")
    try:
        with open(os.path.join(os.path.expanduser(home), "keras.json")) as file:
            return json.load(file).get("backend", "tensorflow")
    except (OSError, ValueError):
        return "tensorflow"


def cpu_cores():
    """The cores this process may run on (its CPU affinity where the OS reports one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def set_fused_training(enabled):
    """Turns kzoo's fused training ops on (the default) or off, everywhere.

    Takes effect for functions traced afterwards: set it before
    `model.fit` (a model that has trained already keeps its traced step
    until it is compiled again).

    Args:
        enabled: bool.

    Example:
    >>> kzoo.config.set_fused_training(False)  # plain keras.ops everywhere
    >>> kzoo.config.is_fused_training_enabled()
    False
    """
    if not isinstance(enabled, bool):
        raise ValueError(f"`enabled` must be a bool; received enabled={enabled!r}.")
    global _fused_training
    _fused_training = enabled


def is_fused_training_enabled():
    """Whether kzoo's training ops may run fused (see `set_fused_training`)."""
    return _fused_training
