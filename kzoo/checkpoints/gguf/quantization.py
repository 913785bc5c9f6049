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

    def group(start):
        values = quant.dequantize_rows(rows[start : start + step])
        if transposed:
            out[:, start : start + step] = values.T
        else:
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
