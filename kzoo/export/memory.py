"""How much memory an export needs, and whether the host has it: `check_memory`.

An export holds several copies of the model's weights at once (the Keras variables, the flatbuffer
bytes, the quantizer's, LiteRT's packed weights in the checks), so its
peak grows with the model's float32 weight bytes W. `estimated_peak_bytes` models it as

    peak = WEIGHT_COPIES x W + CHECK_COPIES x (cache bytes + logits bytes) + BASE_BYTES

where the cache bytes are one bundle's KV cache (layers x 2 x KV heads x cache length x head width
x 4 bytes) and the logits bytes those of the LiteRT-LM check, its held-out rows of the checked
length over the vocabulary, in float32 (the Keras reference holds them and half as many again).

The constants are fitted, not derived, on two exports measured by `benchmarks/export_memory.py`
(2026-11-27, 2-core AVX2 host) once the LiteRT-LM checks read each bundle's model from a file and
LiteRT and LiteRT-LM pack its weights into caches in files: SmolLM2-135M (W = 0.54 GB, vocabulary
49,152; `--formats litertlm,litertlm_int4 --cache-length 2048 --max-length 256 --num-examples 8`)
peaked at 7.85 GB, and Qwen2.5-Coder-0.5B (W = 2.52 GB, vocabulary 151,936; `--formats
litertlm,litertlm_int4`, a 4,096-slot cache, 8 checked rows of 256 positions) at 17.0 GB, both in
their int4 bundle's quantization (before, 8.65 and 22.1 GB). The estimate gives 7.9 and 17.1 GB.
What the weight factor counts is the Keras variables, the copy of the float32 file each
quantization pass makes, and the file mappings LiteRT reads (resident while read, though the
kernel can drop them); the base, mostly TensorFlow's converter on the decoder's graph.
"""

import ctypes
import gc
import os

# Copies of the float32 weights resident at an export's peak, and of its check buffers (measured;
# see the module docstring).
WEIGHT_COPIES = 4.0
CHECK_COPIES = 1.5
BASE_BYTES = int(5.0e9)


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


def estimated_peak_bytes(weight_bytes, cache_bytes=0, logits_bytes=0):
    """The export's estimated peak resident memory (the module docstring's model), in bytes."""
    return int(WEIGHT_COPIES * weight_bytes + CHECK_COPIES * (cache_bytes + logits_bytes) + BASE_BYTES)


def release_freed_memory():
    """Collects Python's garbage and hands the C heap's free pages back to the system (glibc's
    `malloc_trim`; elsewhere a garbage collection alone): TensorFlow's converter frees gigabytes
    that glibc otherwise keeps in its arenas, resident through the checks that follow."""
    gc.collect()
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
    model, cache_length, check_length, check_rows, vocabulary_size, available=None, resident=None, ignore=False
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

    Returns:
        `{"estimated_peak_bytes", "available_bytes", "resident_bytes"}`.
    """
    available = available_bytes() if available is None else available
    resident = resident_bytes() if resident is None else resident
    weights = float32_weight_bytes(model)
    logits = 4 * check_rows * check_length * vocabulary_size
    peak = estimated_peak_bytes(weights, cache_bytes(model, cache_length), logits)
    if not ignore and available is not None and peak - resident > available:
        raise ValueError(
            f"The export is estimated to peak at {peak / 1e9:.1f} GB of memory ({WEIGHT_COPIES:g} x the "
            f"model's {weights / 1e9:.2f} GB of float32 weights, its checks and {BASE_BYTES / 1e9:g} GB of "
            f"libraries); this process holds {resident / 1e9:.1f} GB and the host has {available / 1e9:.1f} GB "
            "available, so it would run out of memory. Free memory, pass a smaller cache_length (--cache-length) "
            "or max_length (--max-length), or pass ignore_memory_estimate=True (--ignore-memory-estimate) to "
            "export anyway."
        )
    return {"estimated_peak_bytes": peak, "available_bytes": available, "resident_bytes": resident}
