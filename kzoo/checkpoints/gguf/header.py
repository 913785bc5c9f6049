"""A GGUF file's header, parsed with every length checked against the file before it is used.

A file from outside is untrusted, so it is parsed here, not by `gguf.GGUFReader`: that reader
walks an array's declared count even past the end of the file, and is slow over a large
vocabulary (BENCHMARKS.md). Every tensor's byte range is checked before anything is read.
"""

import dataclasses
import struct

import gguf
import numpy as np

from kzoo.checkpoints.errors import CheckpointError
from kzoo.checkpoints.errors import problem_lines
from kzoo.checkpoints.gguf.quantization import SUPPORTED_TYPES
from kzoo.checkpoints.gguf.quantization import byte_size

_V = gguf.GGUFValueType
# Scalar value types -> their `struct` / NumPy format (little-endian).
_FORMATS = {
    _V.UINT8: "B", _V.INT8: "b", _V.BOOL: "?", _V.UINT16: "H", _V.INT16: "h", _V.UINT32: "I", _V.INT32: "i",
    _V.FLOAT32: "f", _V.UINT64: "Q", _V.INT64: "q", _V.FLOAT64: "d",
}  # fmt: skip
INTEGERS = {_V.UINT8, _V.INT8, _V.UINT16, _V.INT16, _V.UINT32, _V.INT32, _V.UINT64, _V.INT64}
FLOATS = {_V.FLOAT32, _V.FLOAT64}
_MAX_DIMS = 4  # GGML_MAX_DIMS
# Arrays nested deeper are refused: llama.cpp's fields are flat arrays, and each level is a
# recursive call (a hostile file of 20,000 levels would exhaust Python's stack).
_LENGTH = struct.Struct("<Q")  # a string's byte count
_MAX_ARRAY_DEPTH = 8


@dataclasses.dataclass(frozen=True)
class _Field:
    """A metadata field: its GGUF types (`(type,)` or `(ARRAY, item type)`) and Python value."""

    types: tuple
    value: object


@dataclasses.dataclass(frozen=True)
class _Tensor:
    """A tensor's description: its GGUF name and type, Hugging Face shape (rows first) and bytes."""

    name: str
    type: gguf.GGMLQuantizationType
    shape: tuple
    start: int
    size: int


class Header:
    """A GGUF header parsed with every length checked against the file before it is used.

    Attributes:
        fields: `{key: _Field}`.
        tensors: `[_Tensor]`, each one's bytes inside the file.
    """

    def __init__(self, path, data):
        self.path, self.data, self.position = path, data, 4  # after the magic
        version = self.unpack("I", "the version")
        if version & 0xFFFF == 0:
            raise CheckpointError(f"{path} is a big-endian GGUF file; kzoo reads little-endian ones.")
        if version not in (2, 3):
            raise CheckpointError(f"{path} is GGUF version {version}; kzoo reads versions 2 and 3.")
        tensor_count = self.unpack("Q", "the tensor count")
        field_count = self.unpack("Q", "the metadata count")
        left = len(data) - self.position
        # A metadata field takes at least 13 bytes, a tensor's description at least 24.
        if field_count * 13 + tensor_count * 24 > left:
            raise CheckpointError(
                f"{path} is truncated or corrupt: its header declares {field_count} metadata fields and "
                f"{tensor_count} tensors, more than its {left} bytes can hold."
            )
        self.fields = {}
        for index in range(field_count):
            key = self.string(f"metadata field {index}'s name")
            what = f"the metadata field {key!r}"
            if key in self.fields:
                raise CheckpointError(f"{path} holds {what} twice.")
            value_type = self.value_type(what)
            if value_type == _V.ARRAY:
                item_type = self.value_type(what)
                self.fields[key] = _Field((value_type, item_type), self.array(item_type, what, depth=1))
            else:
                self.fields[key] = _Field((value_type,), self.value(value_type, what))
        alignment = self.fields.get("general.alignment", _Field((_V.UINT32,), gguf.GGUF_DEFAULT_ALIGNMENT))
        if alignment.types != (_V.UINT32,) or alignment.value == 0 or alignment.value & (alignment.value - 1):
            kind = "/".join(value_type.name for value_type in alignment.types)
            raise CheckpointError(
                f"{path}: general.alignment must be a UINT32 power of two; it is {kind} {alignment.value}."
            )
        infos = []
        for index in range(tensor_count):
            name = self.string(f"tensor {index}'s name")
            what = f"the description of tensor {name!r}"
            dims = self.unpack("I", what)
            if not 1 <= dims <= _MAX_DIMS:
                raise CheckpointError(f"{path}: tensor {name!r} has {dims} dimensions; GGUF allows 1 to 4.")
            shape = [self.unpack("Q", what) for _ in range(dims)]
            infos.append((name, shape, self.unpack("I", what), self.unpack("Q", what)))
        data_start = -(-self.position // alignment.value) * alignment.value
        self.tensors, problems, names = [], [], set()
        for name, shape, raw_type, offset in infos:
            tensor = self.tensor(name, shape, raw_type, data_start + offset)
            if name in names:
                tensor = f"tensor {name!r} appears twice"
            names.add(name)
            (problems if isinstance(tensor, str) else self.tensors).append(tensor)
        problems += _overlaps(self.tensors)
        if problems:
            raise CheckpointError(f"Cannot read {path}:" + problem_lines(problems))

    def take(self, size, what):
        """The position of the next `size` bytes, which must be in the file."""
        end = self.position + size
        if end > len(self.data):
            raise CheckpointError(
                f"{self.path} is truncated: {what} needs bytes {self.position}..{end}, but the file "
                f"has {len(self.data)} bytes."
            )
        start, self.position = self.position, end
        return start

    def unpack(self, fmt, what):
        return struct.unpack_from("<" + fmt, self.data, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what):
        length = self.unpack("Q", what)
        start = self.take(length, what)
        try:
            return self.data[start : start + length].decode("utf-8")
        except UnicodeDecodeError as error:
            raise CheckpointError(f"{self.path}: {what} is not UTF-8 text.") from error

    def value_type(self, what):
        raw = self.unpack("I", what)
        try:
            return _V(raw)
        except ValueError:
            raise CheckpointError(f"{self.path}: {what} has value type {raw}, which GGUF does not define.") from None

    def value(self, value_type, what, depth=0):
        if value_type == _V.STRING:
            return self.string(what)
        if value_type in _FORMATS:
            return self.unpack(_FORMATS[value_type], what)
        return self.array(self.value_type(what), what, depth + 1)

    def array(self, item_type, what, depth):
        """The items of an array at nesting level `depth` (1: a field's own array)."""
        if depth > _MAX_ARRAY_DEPTH:
            raise CheckpointError(
                f"{self.path}: {what} nests arrays more than {_MAX_ARRAY_DEPTH} deep; kzoo reads up to "
                f"{_MAX_ARRAY_DEPTH} levels (llama.cpp's fields are flat arrays)."
            )
        count = self.unpack("Q", what)
        least = struct.calcsize(_FORMATS[item_type]) if item_type in _FORMATS else 8 if item_type == _V.STRING else 12
        left = len(self.data) - self.position
        if count * least > left:
            raise CheckpointError(
                f"{self.path} is truncated or corrupt: {what} declares {count} items, more than the "
                f"{left} bytes left can hold."
            )
        if item_type in _FORMATS:
            start = self.take(count * least, what)
            return np.frombuffer(self.data, np.dtype("<" + _FORMATS[item_type]), count, start).tolist()
        if item_type == _V.STRING:
            return self.strings(count, what)
        return [self.value(item_type, what, depth) for _ in range(count)]

    def strings(self, count, what):
        """`count` strings, as `string` reads them, in one tight loop: a vocabulary holds hundreds of
        thousands. Where one is short of bytes or not UTF-8, `string` reads it again to say so."""
        data, position, size = self.data, self.position, len(self.data)
        length_at = _LENGTH.unpack_from
        items = []
        for _ in range(count):
            stop = position + 8 + (length_at(data, position)[0] if position + 8 <= size else 0)
            if stop > size:
                break
            try:
                items.append(data[position + 8 : stop].decode("utf-8"))
            except UnicodeDecodeError:
                break
            position = stop
        self.position = position
        if len(items) < count:
            self.string(what)  # raises, naming the field and the bytes
        return items

    def tensor(self, name, shape, raw_type, start):
        """The tensor's `_Tensor`, or what is wrong with it."""
        try:
            tensor_type = gguf.GGMLQuantizationType(raw_type)
        except ValueError:
            return f"tensor {name!r} has type number {raw_type}, which gguf does not know"
        if tensor_type.name not in SUPPORTED_TYPES:
            return f"tensor {name!r} is {tensor_type.name}, which kzoo cannot dequantize; supported: {SUPPORTED_TYPES}"
        block, _ = gguf.GGML_QUANT_SIZES[tensor_type]
        if shape[0] % block:
            return f"tensor {name!r} has rows of {shape[0]} values, not a multiple of {tensor_type.name}'s {block}"
        size = byte_size(tensor_type, shape)
        if start + size > len(self.data):
            return (
                f"tensor {name!r} ({tensor_type.name}, GGUF shape {shape}) needs bytes {start}..{start + size}, "
                f"past the end of the file ({len(self.data)} bytes): the file is truncated or its header is corrupt"
            )
        return _Tensor(name, tensor_type, tuple(reversed(shape)), start, size)


def _overlaps(tensors):
    """What is wrong where `_Tensor`s share bytes: a file whose tensors overlap is corrupt or
    crafted (two weights would read the same numbers), and llama.cpp lays each out on its own."""
    problems, last = [], None  # last: the tensor reaching furthest so far
    for tensor in sorted((tensor for tensor in tensors if tensor.size), key=lambda tensor: tensor.start):
        if last is not None and tensor.start < last.start + last.size:
            problems.append(
                f"tensors {last.name!r} (bytes {last.start}..{last.start + last.size}) and {tensor.name!r} "
                f"(bytes {tensor.start}..{tensor.start + tensor.size}) overlap: each tensor needs bytes of its own"
            )
        if last is None or tensor.start + tensor.size > last.start + last.size:
            last = tensor
    return problems
