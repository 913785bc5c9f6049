"""How much memory an export needs, and whether the host has it: `check_memory`.

An export's peak grows with the model's float32 weight bytes W: the Keras variables, TensorFlow's
converter beside them, a bundle's file mapped by LiteRT in its check with the weights XNNPACK
packed from it (in a cache file, also mapped), the int4 rewrites reading every weight of the
mapped float32 file. `estimated_peak_bytes` models it as

    peak = copies x W + CHECK_COPIES x (cache bytes + logits bytes) + base

where the cache bytes are one bundle's KV cache (layers x 2 x KV heads x cache length x head width
x 4 bytes) and the logits bytes those of the LiteRT-LM check, its held-out rows of the checked
length over the vocabulary, in float32 (the Keras reference holds them all before the
check keeps them in a file). Two sets of constants, fitted, not derived, on exports measured by
`benchmarks/export_memory.py` and `/usr/bin/time -v` (2-core AVX2 host, `--formats
litertlm,litertlm_int4`, a 4,096-slot cache, 8 checked rows of 256 positions, unless said):

- the export loaded the model itself (from a path: the command line) and lets go of it once the
  float32 file is converted, which TensorFlow's converter makes a signature at a time
  (`RELEASED_WEIGHT_COPIES`, `RELEASED_BASE_BYTES`; 2026-11-28, the checks' own signature
  converted too): SmolLM2-135M (the options below) peaked at 4.58 GB, in the converter,
  Qwen2.5-Coder-0.5B (W = 2.52 GB, vocabulary 151,936) at 6.58 GB, in the converter and in the
  Keras reference's quality beside the model, and -1.5B (W = 7.11 GB) at 14.45 GB in its int4
  bundle's rewrites; the checks hold no Keras weights. The peaks are not linear in W (what does
  not grow with the width, TensorFlow and its traced graphs, weighs most in a small model): a line
  just above the smallest and the largest covers all three, 4.66, 8.30 (26% over) and 14.9 GB.
  On a 2-core AVX-512 host (2026-12-02) the 1.5B peaked at 15.35 GB in those rewrites, and at
  12.72 GB, in the float32 file's conversion, once they held each weight's codes as int8 (left
  as fitted: the estimate, 14.9 GB, is above the peaks measured since).
- the caller holds the model (passed as an object) through the checks (`WEIGHT_COPIES`,
  `BASE_BYTES`; 2026-11-28, before the exporter let go of a model): SmolLM2-135M (W = 0.54 GB,
  vocabulary 49,152; `--cache-length 2048 --representative-data kzoo_tiny_shakespeare
  --max-length 256 --num-examples 8`) peaked at 6.6 GB, the 0.5B at 11.0 GB and the 1.5B at
  23.7 GB in its int4 bundle's rewrites; the estimate gives 6.6, 13.0 and 26.0 GB.

Mapped files count while their pages are resident, though the kernel can drop them; the base is
mostly TensorFlow, its traced functions and its converter's graph of the decoder.
"""

import ctypes
import gc
import os

# Copies of the float32 weights resident at an export's peak, and of its check buffers (measured;
# see the module docstring): with the Keras model held through the checks, and let go of.
WEIGHT_COPIES = 2.8
BASE_BYTES = int(4.6e9)
RELEASED_WEIGHT_COPIES = 1.41
RELEASED_BASE_BYTES = int(3.4e9)
CHECK_COPIES = 1.0


def float32_weight_bytes(model):
    """The bytes of `model`'s weights in float32, as the exported float32 files hold them."""
    return 4 * int(model.count_params())


def cache_bytes(model, cache_length):
    """The bytes of one float32 KV cache of `cache_length` positions of `model` (0 for a model
    without a decoder backbone)."""
    backbone = getattr(model, "backbone", None)
    layers, heads = getattr(backbone, "num_layers", None), getattr(backbone, "num_heads", None)
    if not layers or not heads:
        return 0
    kv_heads = getattr(backbone, "num_key_value_heads", None) or heads
    head_dim = getattr(backbone, "head_dim", None) or backbone.hidden_dim // heads
    return 4 * layers * 2 * kv_heads * cache_length * head_dim


def estimated_peak_bytes(weight_bytes, cache_bytes=0, logits_bytes=0, releases_model=False):
    """The export's estimated peak resident memory (the module docstring's model), in bytes;
    `releases_model`: whether the export lets go of the Keras model before its checks."""
    copies, base = _constants(releases_model)
    return int(copies * weight_bytes + CHECK_COPIES * (cache_bytes + logits_bytes) + base)


def _constants(releases_model):
    """`(weight copies, base bytes)` of the estimate for an export that lets go of its model or not."""
    return (RELEASED_WEIGHT_COPIES, RELEASED_BASE_BYTES) if releases_model else (WEIGHT_COPIES, BASE_BYTES)


def release_freed_memory():
    """Collects Python's garbage and hands the C heap's free pages back to the system (glibc's
    `malloc_trim`; elsewhere a garbage collection alone): TensorFlow's converter frees gigabytes
    that glibc otherwise keeps in its arenas, resident through the checks that follow.

    Collects until a pass finds nothing: a traced function's graph is a cycle that a first
    pass only frees the way to (its weights' handles go in a second)."""
    for _ in range(8):
        if not gc.collect():
            break
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def available_bytes():
    """The host's available memory (`MemAvailable` of /proc/meminfo), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def resident_bytes(field="VmRSS"):
    """This process's resident memory (`VmRSS`) or its peak so far (`VmHWM`), or 0 where it
    cannot be read."""
    try:
        with open(f"/proc/{os.getpid()}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


def check_memory(
    model,
    cache_length,
    check_length,
    check_rows,
    vocabulary_size,
    available=None,
    resident=None,
    ignore=False,
    releases_model=False,
):
    """Raises ValueError when the export's estimated peak does not fit in the memory left.

    The peak (`estimated_peak_bytes`) counts what this process already holds (the loaded model
    among it), so the memory it still needs is the estimate less `resident`; that must fit in
    `available`.

    Args:
        model: the loaded Keras model.
        cache_length: int, the exported KV cache's positions.
        check_length: int, the length the files are checked at.
        check_rows: int, the rows the LiteRT-LM check runs at once (`kzoo.export.formats.LITERTLM_ROWS`).
        vocabulary_size: int.
        available: bytes the host has available; None reads `available_bytes()` (where that
            cannot be read either, nothing is checked).
        resident: bytes this process holds now; None reads `resident_bytes()`.
        ignore: bool, return the estimate without raising.
        releases_model: bool, whether the export lets go of the model before its checks (it
            loaded the model itself).

    Returns:
        `{"estimated_peak_bytes", "available_bytes", "resident_bytes"}`.
    """
    available = available_bytes() if available is None else available
    resident = resident_bytes() if resident is None else resident
    weights = float32_weight_bytes(model)
    logits = 4 * check_rows * check_length * vocabulary_size
    peak = estimated_peak_bytes(weights, cache_bytes(model, cache_length), logits, releases_model)
    copies, base = _constants(releases_model)
    if not ignore and available is not None and peak - resident > available:
        raise ValueError(
            f"The export is estimated to peak at {peak / 1e9:.1f} GB of memory ({copies:g} x the "
            f"model's {weights / 1e9:.2f} GB of float32 weights, its checks and {base / 1e9:g} GB of "
            f"libraries); this process holds {resident / 1e9:.1f} GB and the host has {available / 1e9:.1f} GB "
            "available, so it would run out of memory. Free memory, pass a smaller cache_length (--cache-length) "
            "or max_length (--max-length), or pass ignore_memory_estimate=True (--ignore-memory-estimate) to "
            "export anyway."
        )
    return {"estimated_peak_bytes": peak, "available_bytes": available, "resident_bytes": resident}
