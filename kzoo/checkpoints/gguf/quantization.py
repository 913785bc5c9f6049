"""GGUF tensor types: which kzoo reads and writes, their sizes, and llama.cpp's choice when writing.

The arithmetic of each type is `gguf.quants`'; this module is kzoo's side of it.
"""

import concurrent.futures
import math

import gguf
import numpy as np

from kzoo import config
from kzoo.checkpoints import arrays

# Every type `gguf.quants.dequantize` turns into float32.
SUPPORTED_TYPES = (
    "F32", "F16", "BF16",
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS",
    "TQ1_0", "TQ2_0", "MXFP4", "NVFP4",
)  # fmt: skip
# `write_gguf`'s file types: the 2-D weights' type, as convert_hf_to_gguf.py's `--outtype`.
FILE_TYPES = {
    "F32": gguf.LlamaFileType.ALL_F32,
    "F16": gguf.LlamaFileType.MOSTLY_F16,
    "BF16": gguf.LlamaFileType.MOSTLY_BF16,
    "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
}


def byte_size(tensor_type, shape):
    """The bytes a tensor of `tensor_type` (a `gguf.GGMLQuantizationType`) and `shape` takes."""
    block, type_size = gguf.GGML_QUANT_SIZES[tensor_type]
    return math.prod(shape) // block * type_size


# Values dequantized per call of a block type's `dequantize_rows`: gguf's own `dequantize` calls it on 16
# rows at a time, where NumPy's fixed cost per operation dominates; this many values keep each call's
# temporaries within the caches (a few MB), and let calls run on every core (NumPy releases the GIL on
# large arrays).
GROUP_VALUES = 1 << 18
_FLOATS = ("F32", "F16", "BF16")
_NIBBLES = np.uint64(0x0F0F0F0F0F0F0F0F)


def _scales(blocks):
    """The float16 scale `d` each block starts with, as float32 `(blocks, 1)`."""
    return blocks[:, :2].copy().view(np.float16).astype(np.float32)


def _q5_0_into(blocks, out):
    """Q5_0 blocks (`d`, 32 high bits, 16 bytes of low nibbles) into `out`, `(blocks, 32)`: gguf's
    `d * (q - 16)`, with the nibbles split eight at a time in 64-bit words and the high bits unpacked by
    `np.unpackbits`, where gguf shifts every value by its own position."""
    count = blocks.shape[0]
    low = blocks[:, 6:].copy().view(np.uint64)  # (blocks, 2): bytes j hold values j and j + 16
    q = np.empty((count, 4), np.uint64)  # values 0-15, then 16-31, one per byte
    np.bitwise_and(low, _NIBBLES, out=q[:, :2])
    np.right_shift(low, np.uint64(4), out=q[:, 2:])
    q[:, 2:] &= _NIBBLES
    high = np.unpackbits(blocks[:, 2:6], axis=1, bitorder="little").view(np.uint64)  # bit i of value i
    high <<= np.uint64(4)
    q |= high
    np.subtract(q.view(np.uint8).reshape(count, 32), np.float32(16), out=out, dtype=np.float32)
    out *= _scales(blocks)


def _q8_0_into(blocks, out):
    """Q8_0 blocks (`d`, 32 int8) into `out`, `(blocks, 32)`: gguf's `x * d`."""
    np.multiply(blocks[:, 2:].view(np.int8), _scales(blocks), out=out, dtype=np.float32)


# Block types kzoo dequantizes itself, straight into the output, with gguf's values bit for bit: the
# types llama.cpp's Q4_K_M files hold most of their weights in.
_INTO = {"Q5_0": _q5_0_into, "Q8_0": _q8_0_into}


def dequantize(raw, tensor_type, shape, order="C"):
    """The float32 values of `raw` (the tensor's bytes, a uint8 array) of `tensor_type` and
    Hugging Face `shape` (rows last), exactly as `gguf.quants.dequantize` gives them; F32's are a
    view of `raw`. Block types are dequantized in groups of rows on every core, into an array a
    variable can adopt (`arrays.empty`); with `order` "F" a 2-D one is written column-major (each
    group transposed while it is in the caches), for a caller that wants its transpose."""
    block, type_size = gguf.GGML_QUANT_SIZES[tensor_type]
    rows = raw.reshape(-1, shape[-1] // block * type_size)
    quant = getattr(gguf.quants, tensor_type.name, None)
    if tensor_type.name in _FLOATS or quant is None or rows.shape[0] == 1:
        return gguf.quants.dequantize(rows.reshape(*shape[:-1], -1), tensor_type)
    quant.init_grid()  # the IQ types' lookup grid, once
    transposed = order == "F" and len(shape) == 2
    out = arrays.empty((shape[-1], rows.shape[0]) if transposed else (rows.shape[0], shape[-1]), np.float32)
    step = max(1, GROUP_VALUES // shape[-1])

    into = _INTO.get(tensor_type.name)

    def group(start):
        band = rows[start : start + step]
        if into is None:
            values = quant.dequantize_rows(band)
        else:
            values = np.empty((band.shape[0], shape[-1]), np.float32) if transposed else out[start : start + step]
            into(band.reshape(-1, type_size), values.reshape(-1, block))
        if transposed:
            out[:, start : start + step] = values.T
        elif into is None:
            out[start : start + step] = values

    starts = range(0, rows.shape[0], step)
    if len(starts) == 1:
        group(0)
    else:
        with concurrent.futures.ThreadPoolExecutor(config.cpu_cores()) as pool:
            list(pool.map(group, starts))
    return out.T if transposed else out.reshape(shape)


def written_type(gguf_name, array, file_type):
    """llama.cpp's choice: F32 for 1-D tensors and norms, F16 where Q8_0's 32-value blocks do not
    divide the rows, else the file type."""
    if array.ndim <= 1 or gguf_name.endswith("_norm.weight"):
        return gguf.GGMLQuantizationType.F32
    qtype = gguf.GGMLQuantizationType[file_type]
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    return qtype if array.shape[-1] % block == 0 else gguf.GGMLQuantizationType.F16
