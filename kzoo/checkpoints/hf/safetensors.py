"""safetensors files, read into NumPy without torch: one file, or a folder's shards.

Float32, float16, bfloat16 and float64 tensors are weights, read as float32. A file from outside
is not trusted: its header is checked against the file before any tensor is read.
"""

import json
import math
import mmap
import os
import struct
from pathlib import Path

import numpy as np

from kzoo.checkpoints.errors import CheckpointError

WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
_TORCH_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack")


# safetensors dtype -> NumPy dtype; bfloat16 and float8 come from ml_dtypes (which TensorFlow and
# JAX install). Only floating-point tensors are weights.
def _safetensors_dtypes():
    import ml_dtypes

    return {
        "F64": np.dtype("<f8"),
        "F32": np.dtype("<f4"),
        "F16": np.dtype("<f2"),
        "BF16": np.dtype(ml_dtypes.bfloat16),
        "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
        "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
        "I64": np.dtype("<i8"),
        "I32": np.dtype("<i4"),
        "I16": np.dtype("<i2"),
        "I8": np.dtype("i1"),
        "U8": np.dtype("u1"),
        "BOOL": np.dtype("?"),
    }


FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")


class SafetensorsFile:
    """One safetensors file, memory-mapped; its header is checked against the file before any
    tensor is read (each tensor's byte range inside the data, its size its shape's, no two
    ranges sharing bytes)."""

    def __init__(self, path):
        self.path = Path(path)
        size = self.path.stat().st_size
        try:
            with open(self.path, "rb") as file:
                if size < 8:
                    raise ValueError(f"{size} bytes, shorter than the 8-byte header length")
                (header_size,) = struct.unpack("<Q", file.read(8))
                if header_size > size - 8:
                    raise ValueError(f"a header of {header_size} bytes in a file of {size}")
                header = json.loads(file.read(header_size).decode("utf-8"))
            self._data_start = 8 + header_size
            self._entries = self._check(header, size - self._data_start)
            self._map = mmap.mmap(os.open(self.path, os.O_RDONLY), 0, access=mmap.ACCESS_READ) if size else None
        except (ValueError, UnicodeDecodeError, OSError, struct.error) as error:
            raise CheckpointError(
                f"{self.path} is not a readable safetensors file ({error}); it may be truncated or corrupt."
            ) from error

    @staticmethod
    def _check(header, data_size):
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
        dtypes = _safetensors_dtypes()
        entries, ranges = {}, []
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            except (TypeError, KeyError, ValueError) as error:
                raise ValueError(f"tensor {name!r} has a malformed entry {entry!r}") from error
            if dtype not in dtypes:
                raise ValueError(f"tensor {name!r} has the unknown dtype {dtype!r}")
            if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (*shape, begin, end)):
                raise ValueError(f"tensor {name!r} has a malformed shape or offsets: {entry!r}")
            nbytes = math.prod(shape) * dtypes[dtype].itemsize
            if not begin <= end <= data_size or end - begin != nbytes:
                raise ValueError(
                    f"tensor {name!r} ({dtype} {shape}, {nbytes} bytes) is said to lie at bytes [{begin}, {end}) "
                    f"of {data_size} bytes of data"
                )
            entries[name] = (dtype, tuple(shape), begin)
            ranges.append((begin, end, name))
        # Tensors sharing bytes: a corrupt or crafted file (two weights reading the same numbers).
        last = None  # (end, name) of the range reaching furthest so far
        for begin, end, name in sorted(ranges):
            if last is not None and begin < last[0] and begin < end:
                raise ValueError(
                    f"tensors {last[1]!r} and {name!r} share bytes: {name!r} starts at byte {begin}, "
                    f"before {last[1]!r} ends at {last[0]}"
                )
            if begin < end and (last is None or end > last[0]):
                last = (end, name)
        return entries

    def names(self):
        return list(self._entries)

    def dtype(self, name):
        return self._entries[name][0]

    def shape(self, name):
        return self._entries[name][1]

    def read(self, name):
        """The tensor `name` as a float32 NumPy array (a copy)."""
        dtype, shape, begin = self._entries[name]
        numpy_dtype = _safetensors_dtypes()[dtype]
        count = math.prod(shape)
        array = np.frombuffer(self._map, numpy_dtype, count, self._data_start + begin) if count else np.zeros(0)
        return array.astype(np.float32).reshape(shape)


class SafetensorsReader:
    """The tensors of a folder's `model.safetensors` (or its shards), read on demand as float32 arrays."""

    def __init__(self, path):
        path = Path(path)
        self.files = {}  # tensor name -> SafetensorsFile
        index = path / WEIGHTS_INDEX_FILE
        if (path / WEIGHTS_FILE).is_file():
            shards = [path / WEIGHTS_FILE]
        elif index.is_file():
            shards = [path / name for name in _index_shards(index)]
        else:
            torch_files = [name for name in _TORCH_FILES if (path / name).is_file()]
            hint = (
                f" It holds {torch_files}: convert it to safetensors first (e.g. load it with transformers and "
                "`save_pretrained(folder, safe_serialization=True)`); kzoo reads no pickled weights."
                if torch_files
                else ""
            )
            raise CheckpointError(f"{path} has no {WEIGHTS_FILE} and no {WEIGHTS_INDEX_FILE}.{hint}")
        for shard in shards:
            if not shard.is_file():
                raise CheckpointError(f"{index} lists the shard {shard.name}, which is missing.")
            file = SafetensorsFile(shard)
            for name in file.names():
                self.files[name] = file

    def names(self):
        return set(self.files)

    def shape(self, name):
        return self.files[name].shape(name)

    def dtype(self, name):
        """The tensor's dtype as the file names it: "F32", "BF16", ..."""
        return self.files[name].dtype(name)

    def values(self):
        """How many numbers all tensors hold together (from the headers)."""
        return sum(math.prod(self.shape(name)) for name in self.files)

    def sources(self):
        """The files the tensors come from, for messages."""
        return sorted({file.path.name for file in self.files.values()})

    def read(self, name, order="C"):
        """The tensor `name` as a float32 NumPy array (a copy), C-contiguous whatever `order` asks
        (the GGUF reader's hint)."""
        return self.files[name].read(name)


def _index_shards(index):
    """The shard file names of a safetensors index: plain names of files beside it."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise CheckpointError(f"{index} is not a safetensors index (a JSON 'weight_map'): {error}") from error
    for name in shards:
        if not isinstance(name, str) or Path(name).name != name or name.startswith("."):
            raise CheckpointError(
                f"{index} lists the shard {name!r}: shards must be files in the checkpoint's folder, named "
                "without a path."
            )
    return shards
