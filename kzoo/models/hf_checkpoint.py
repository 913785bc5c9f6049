"""Hugging Face checkpoints: local folders in `transformers`' layout, read and written.

A folder holds `config.json` and the weights as `model.safetensors` or as shards listed in
`model.safetensors.index.json`, plus the tokenizer's files (see `kzoo.models.hf_tokenizer`).
Weights are read from the safetensors files into NumPy (float32, float16, bfloat16 and float64
tensors, as float32): loading never needs torch.

Each model family (`kzoo/models/bert/bert_hf.py`, `kzoo/models/gpt/gpt_hf.py`,
`kzoo/models/decoder/decoder_hf.py`) registers a `Family` per `model_type`: how a `config.json`
becomes kzoo constructor arguments and back, a list of `TensorMap`s pairing Hugging Face tensor
names with kzoo variables, and how its tokenizer is read. The same maps serve reading and
writing, so the two directions cannot drift apart. A GGUF file (`kzoo.models.gguf_checkpoint`)
is read as a config and tensors under the same names, through the same maps.

Loading is all or nothing, and a file from outside is not trusted:

- every config field is checked (type and range) and errors name the file and the field;
- before anything is built, the layer count of the config must match the tensors', and the
  model the config describes must not need more values than the files hold;
- every tensor is read and checked (present, shaped as the config says, floating point, finite)
  before any weight is set, all problems are reported together with the file and tensor names,
  and the model only exists once everything is in place. Tensors the kzoo model has no place
  for (e.g. BERT's next-sentence head) are named in a warning.
"""

import dataclasses
import json
import math
import mmap
import os
import re
import struct
import warnings
from pathlib import Path

import numpy as np

from kzoo import _compat
from kzoo import files
from kzoo.checkpoints.errors import CheckpointError

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
_TORCH_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack")
# Problems listed in one error before "... and N more".
_MAX_LISTED = 12
# How many more values than the files hold a config may describe (a head or pooler the
# checkpoint lacks, which is newly initialized) before it is refused unbuilt.
_SIZE_SLACK = 0.05
_MIN_SIZE_SLACK = 2**20

FAMILIES = {}


@dataclasses.dataclass(frozen=True, eq=False)
class TensorMap:
    """Hugging Face tensors `names` hold the values of the kzoo variables `weights`.

    Attributes:
        weights: tuple of kzoo variables (e.g. a `Dense`'s kernel and bias).
        names: tuple of Hugging Face tensor names (without the model's prefix).
        to_keras: `f(list of Hugging Face arrays) -> list of arrays, one per variable`.
        to_hf: `f(list of variable values) -> list of Hugging Face arrays`, its inverse.
        layers: the layers owning the weights, in their order (each a kernel and maybe a bias,
            or an embedding table), whose own calls give the values of quantized ones (see
            `values`); empty for variables read directly.
    """

    weights: tuple
    names: tuple
    to_keras: object
    to_hf: object
    layers: tuple = ()


def linear(layer, name, input_axes=1, transposed=True):
    """`name.weight` (and `name.bias` where the layer has one) of a `torch.nn.Linear` (`(out,
    in)`, `transposed`) or of GPT-2's `Conv1D` (`(in, out)`) as the kernel (and bias) of a Keras
    `Dense` or `EinsumDense`, whose kernel's first `input_axes` axes are the input ones."""
    kernel_shape = tuple(layer.kernel.shape)
    inputs = math.prod(kernel_shape[:input_axes])
    bias = getattr(layer, "bias", None)

    def to_keras(arrays):
        weight = arrays[0].T if transposed else arrays[0]
        return [weight.reshape(kernel_shape)] + [b.reshape(bias.shape) for b in arrays[1:]]

    def to_hf(arrays):
        weight = arrays[0].reshape(inputs, -1)
        return [weight.T if transposed else weight] + [b.reshape(-1) for b in arrays[1:]]

    if bias is None:
        return TensorMap((layer.kernel,), (f"{name}.weight",), to_keras, to_hf, (layer,))
    return TensorMap((layer.kernel, bias), (f"{name}.weight", f"{name}.bias"), to_keras, to_hf, (layer,))


def fused_linear(layers, name, transposed=True):
    """One `torch.nn.Linear` (or GPT-2 `Conv1D`, not `transposed`) `name` holding the projections of
    several `Dense` / `EinsumDense` `layers` one after another along its outputs: GPT-2's `c_attn`
    (query, key and value, with biases), Phi-3's `qkv_proj` and `gate_up_proj`."""
    kernel_shapes = [tuple(layer.kernel.shape) for layer in layers]
    biases = [getattr(layer, "bias", None) for layer in layers]
    sizes = [math.prod(shape[1:]) for shape in kernel_shapes]
    splits = np.cumsum(sizes)[:-1]

    def to_keras(arrays):
        weight = arrays[0] if transposed else arrays[0].T  # (outputs, in)
        kernels = [part.T.reshape(shape) for part, shape in zip(np.split(weight, splits), kernel_shapes)]
        if biases[0] is None:
            return kernels
        parts = np.split(arrays[1], splits)
        return [a for kernel, bias, part in zip(kernels, biases, parts) for a in (kernel, part.reshape(bias.shape))]

    def to_hf(arrays):
        kernels = arrays if biases[0] is None else arrays[0::2]
        weight = np.concatenate([kernel.reshape(kernel.shape[0], -1) for kernel in kernels], axis=1)  # (in, outputs)
        weight = weight.T if transposed else weight
        return [weight] if biases[0] is None else [weight, np.concatenate([b.reshape(-1) for b in arrays[1::2]])]

    if biases[0] is None:
        return TensorMap(tuple(layer.kernel for layer in layers), (f"{name}.weight",), to_keras, to_hf, tuple(layers))
    weights = tuple(weight for layer, bias in zip(layers, biases) for weight in (layer.kernel, bias))
    return TensorMap(weights, (f"{name}.weight", f"{name}.bias"), to_keras, to_hf, tuple(layers))


def norm(layer, name):
    """`name.weight` (and `name.bias`) as a LayerNorm's gamma and beta, or an RMSNorm's scale."""
    if hasattr(layer, "gamma"):
        return TensorMap((layer.gamma, layer.beta), (f"{name}.weight", f"{name}.bias"), list, list)
    return TensorMap((layer.scale,), (f"{name}.weight",), list, list)


def embedding(table, name, layer=None):
    """The tensor `name` as the embedding table `table` (a variable) of the `Embedding` `layer`."""
    return TensorMap((table,), (name,), list, list, () if layer is None else (layer,))


@dataclasses.dataclass(frozen=True)
class Family:
    """What kzoo knows of one `model_type`. The functions take the kzoo model (or its backbone).

    Attributes:
        model_type: the `config.json` `model_type`, e.g. "bert".
        backbone_cls: the kzoo backbone class.
        backbone_architecture: the `transformers` class of the bare backbone, e.g. "BertModel".
        backbone_config: `f(config dict, read) -> kzoo constructor kwargs`, where `read` is a
            `ConfigReader`: its fields, type- and range-checked, or a `CheckpointError` naming them.
        hf_config: `f(backbone) -> config dict` (architecture fields only).
        backbone_tensors: `f(backbone) -> [TensorMap]`, names without prefix.
        backbone_prefix: the prefix of the backbone's tensors inside a task model
            ("bert." / "transformer."), or a tuple of the prefixes checkpoints use (kzoo writes
            the first); a bare backbone has none.
        layer_pattern: a regex whose group 1 is the layer index in a tensor name (without
            prefix), to compare the config's layer count with the checkpoint's before building.
        num_layers_field: the config field of the layer count, named when they disagree.
        tokenizer: `f(folder, config) -> (tokenizer or None, the file it came from)`.
        optional_prefixes: tensor name prefixes (without the backbone prefix) that a
            checkpoint may lack; the layers keep their initialization and a warning names them
            (e.g. BERT's pooler, which `BertForMaskedLM` does not have).
        ignored: tensor name suffixes that are buffers, not weights (never reported).
        ignored_prefixes: tensor name prefixes of parts kzoo does not load (a vision tower).
        heads: `{task class name: Head}`.
    """

    model_type: str
    backbone_cls: type
    backbone_architecture: str
    backbone_config: object
    hf_config: object
    backbone_tensors: object
    backbone_prefix: str
    layer_pattern: str
    num_layers_field: str
    tokenizer: object
    optional_prefixes: tuple = ()
    ignored: tuple = ()
    ignored_prefixes: tuple = ()
    heads: dict = dataclasses.field(default_factory=dict)

    @property
    def prefixes(self):
        """The backbone prefixes checkpoints use, the one kzoo writes first."""
        return (self.backbone_prefix,) if isinstance(self.backbone_prefix, str) else tuple(self.backbone_prefix)


@dataclasses.dataclass(frozen=True)
class Head:
    """A task head's Hugging Face counterpart.

    Attributes:
        architectures: the `transformers` classes with this head, e.g.
            ("BertForMaskedLM", "BertForPreTraining"); kzoo writes the first.
        tensors: `f(task) -> [TensorMap]`: the head's tensors (full names).
        task_config: `f(config dict) -> task constructor kwargs` read from a checkpoint of this
            architecture (e.g. `num_classes`), used where the caller gives none.
        hf_config: `f(task) -> config fields` the architecture adds (e.g. `id2label`).
        tied: `{name: backbone tensor name}` (or `f(task) -> that dict`): tensors a checkpoint may
            hold as a copy of a tied one; they must equal it, since kzoo ties them.
        backbone_prefix: whether the architecture prefixes the backbone's tensors.
        has_optional: whether the architecture has the family's optional tensors (BERT's
            pooler: `BertForMaskedLM` and `BertForTokenClassification` are built without it).
    """

    architectures: tuple
    tensors: object = lambda task: []
    task_config: object = lambda config: {}
    hf_config: object = lambda task: {}
    tied: dict = dataclasses.field(default_factory=dict)
    backbone_prefix: bool = True
    has_optional: bool = True


def register_family(family):
    FAMILIES[family.model_type] = family


def head_of(family, task_cls):
    """The family's `Head` for a task class or the nearest base class it has one for, or None."""
    for cls in task_cls.__mro__:
        if cls.__name__ in family.heads:
            return family.heads[cls.__name__]
    return None


def is_hf_folder(path):
    """Whether `path` is a folder with a `transformers` `config.json` (one with a `model_type`).

    Raises:
        CheckpointError: for a `config.json` that is not a JSON object, naming it.
    """
    if not (Path(path) / CONFIG_FILE).is_file():
        return False
    return "model_type" in read_config(path)


def read_config(path):
    """The `config.json` of the folder `path`, as a dict."""
    file = Path(path) / CONFIG_FILE
    if not file.is_file():
        raise CheckpointError(f"{path} has no {CONFIG_FILE}: not a Hugging Face checkpoint folder.")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{file} is not valid JSON: {error}") from error
    if not isinstance(config, dict):
        raise CheckpointError(f"{file} must hold a JSON object; it holds a {type(config).__name__}.")
    return config


class ConfigReader:
    """A checkpoint config's fields, each checked as it is read; errors name the file and field.

    `read(key)` gives a required field, `read(key, default)` an optional one (also when it is
    null); the typed readers (`int`, `number`, `rate`, `bool`, `choice`) also check the value.

    Args:
        config: the config dict.
        source: what to name in errors (the `config.json` path, or a GGUF file).
    """

    _REQUIRED = object()

    def __init__(self, config, source):
        self.config, self.source = config, source

    def __call__(self, key, default=_REQUIRED):
        if key in self.config and self.config[key] is not None:
            return self.config[key]
        if default is self._REQUIRED:
            raise CheckpointError(f"{self.source} lacks the field {key!r}.")
        return default

    def _error(self, key, value, allowed):
        return CheckpointError(f"{self.source} field {key!r} is {value!r}; it must be {allowed}.")

    def int(self, key, default=_REQUIRED, minimum=1):
        value = self(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self._error(key, value, f"an integer >= {minimum}")
        return value

    def number(self, key, default=_REQUIRED):
        """A finite number > 0."""
        value = self(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise self._error(key, value, "a number > 0")
        return value

    def rate(self, key, default=_REQUIRED):
        value = self(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise self._error(key, value, "a number in [0, 1)")
        return float(value)

    def bool(self, key, default=_REQUIRED):
        value = self(key, default)
        if not isinstance(value, bool):
            raise self._error(key, value, "true or false")
        return value

    def choice(self, key, choices, default=_REQUIRED):
        value = self(key, default)
        if value not in choices:
            raise self._error(key, value, f"one of {sorted(choices)}")
        return value


def config_reader(config, path):
    """The `ConfigReader` of the `config.json` dict of the folder `path`."""
    return ConfigReader(config, Path(path) / CONFIG_FILE)


def family_of(config, source):
    """The registered `Family` of a checkpoint's `model_type`; `source` is named in errors."""
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise CheckpointError(
            f"{source} has model_type {model_type!r}, which kzoo cannot load; supported: {sorted(FAMILIES)}."
        )
    return FAMILIES[model_type]


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

    def read(self, name):
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


def load(cls, path, kwargs, reader=None, config=None, source=None):
    """A kzoo backbone or task of class `cls` with the weights (and tokenizer) of a checkpoint.

    See `from_preset`. Tasks get the task kwargs `kwargs` (a task's head config, e.g.
    `num_classes`, defaults to the checkpoint's when it has that head); backbones take them as
    config overrides (e.g. `dropout`, `dtype`).

    Args:
        cls: the kzoo class to build.
        path: a Hugging Face folder, or where `reader` and `config` come from.
        kwargs: as above.
        reader: None (the folder's safetensors) or a reader with `names()`, `shape(name)`,
            `dtype(name)`, `values()`, `sources()` and `read(name)` (a GGUF file's).
        config: None (the folder's `config.json`) or the config dict.
        source: what errors name for the config (default: the `config.json` path).
    """
    config = read_config(path) if config is None else config
    source = source or Path(path) / CONFIG_FILE
    family = family_of(config, source)
    backbone_cls = getattr(cls, "backbone_cls", None)
    is_task = backbone_cls is not None
    wanted = backbone_cls if is_task else cls
    if not issubclass(family.backbone_cls, wanted):
        raise CheckpointError(
            f"{source} holds a {family.model_type!r} model, which "
            f"{family.backbone_cls.__name__} and its tasks load, not {cls.__name__}."
        )
    read = ConfigReader(config, source)
    backbone_kwargs = {**family.backbone_config(config, read), **({} if is_task else dict(kwargs))}
    reader = SafetensorsReader(path) if reader is None else reader
    _check_layers(reader, family, backbone_kwargs, source)
    _check_size(family.backbone_cls, backbone_kwargs, reader, source, path)
    backbone = family.backbone_cls(**backbone_kwargs)
    head = head_of(family, cls) if is_task else None
    architectures = config.get("architectures") or []
    head_in_checkpoint = head is not None and bool(set(head.architectures) & set(architectures))
    if is_task:
        task_kwargs = dict(kwargs)
        if head_in_checkpoint:
            task_kwargs = {**head.task_config(config), **task_kwargs}
        if "tokenizer" not in task_kwargs:
            task_kwargs["tokenizer"] = checkpoint_tokenizer(family, path, config, backbone.vocabulary_size)
        model = cls(backbone=backbone, **task_kwargs)
    else:
        model = backbone
    head_maps = head.tensors(model) if head is not None else []
    _load_weights(
        family.backbone_tensors(backbone),
        head_maps if head_in_checkpoint else [],
        reader,
        family,
        head if head_in_checkpoint else None,
        path,
        model,
    )
    if head_maps and not head_in_checkpoint:
        warnings.warn(
            f"{path} holds no {head.architectures[0]} head (its architectures: {architectures}): "
            f"the head of {cls.__name__} is newly initialized; fine-tune it before use.",
            stacklevel=3,
        )
    return model


def checkpoint_tokenizer(family, path, config, vocabulary_size=None):
    """The folder's tokenizer, read by its family, checked to fit the model's vocabulary; None
    (with a warning) for a folder without tokenizer files."""
    tokenizer, source = family.tokenizer(Path(path), config)
    if tokenizer is None:
        warnings.warn(f"{path} holds no tokenizer files: the model comes without a tokenizer.", stacklevel=4)
        return None
    if vocabulary_size is not None and tokenizer.vocabulary_size() > vocabulary_size:
        raise CheckpointError(
            f"The tokenizer in {source} has {tokenizer.vocabulary_size()} tokens, but the model's vocab_size "
            f"in {Path(path) / CONFIG_FILE} is {vocabulary_size}: its ids would not fit the embedding table."
        )
    return tokenizer


def _check_layers(reader, family, backbone_kwargs, source):
    """The config's layer count against the layers the tensors hold, before anything is built."""
    pattern = re.compile(family.layer_pattern)
    indices = {int(match.group(1)) for name in reader.names() for match in [pattern.search(name)] if match}
    expected = backbone_kwargs.get("num_layers")
    found = max(indices) + 1 if indices else 0
    if expected != found:
        raise CheckpointError(
            f"{source} field {family.num_layers_field!r} is {expected}, but the weights "
            f"({', '.join(reader.sources())}) hold {found} layers."
        )


def _check_size(backbone_cls, backbone_kwargs, reader, source, path):
    """Refuses a config that needs far more values than the checkpoint holds, without allocating them.

    The backbone is built in a Keras `StatelessScope` that leaves its variables uninitialized:
    their shapes exist, their memory does not.
    """
    import keras

    # Keras would initialize the probe's variables at the next scope's exit: forget them.
    with _compat.forgotten_uninitialized_variables(), keras.StatelessScope(initialize_variables=False):
        probe = backbone_cls(**backbone_kwargs)
        needed = sum(math.prod(variable.shape) for variable in probe.weights)
    held = reader.values()
    if needed > held + max(_SIZE_SLACK * held, _MIN_SIZE_SLACK):
        raise CheckpointError(
            f"{source} describes a model of {needed:,} parameters, but its weights "
            f"({', '.join(reader.sources())}) hold {held:,} values: check its sizes."
        )


def _backbone_prefix(names, family):
    """The prefix (one of the family's, or none) that most tensor names start with."""
    counts = {prefix: sum(name.startswith(prefix) for name in names) for prefix in family.prefixes}
    prefix = max(counts, key=counts.get)
    return prefix if counts[prefix] > sum(not name.startswith(family.ignored_prefixes) for name in names) / 2 else ""


def _tied(head, task):
    if head is None:
        return {}
    return head.tied(task) if callable(head.tied) else head.tied


def _load_weights(backbone_maps, head_maps, reader, family, head, path, task=None):
    """Reads, checks and sets the weights of every map; nothing is set unless all are fine."""
    names = reader.names()
    prefix = _backbone_prefix(names, family)
    used, problems, fresh, assignments = set(), [], [], []
    maps = [(map_, [prefix + name for name in map_.names]) for map_ in backbone_maps]
    maps += [(map_, list(map_.names)) for map_ in head_maps]
    for map_, full in maps:
        missing = [name for name in full if name not in names]
        optional = map_ in backbone_maps and map_.names[0].startswith(family.optional_prefixes)
        if missing and optional and len(missing) == len(full):
            fresh += full
            continue
        problems += [f"tensor {name!r} is missing" for name in missing]
        if missing:
            continue
        used.update(full)
        expected = [a.shape for a in map_.to_hf([np.zeros(w.shape, "float32") for w in map_.weights])]
        wrong = [
            f"tensor {name!r} has shape {list(reader.shape(name))}; the config gives {list(want)}"
            for name, want in zip(full, expected)
            if reader.shape(name) != tuple(want)
        ]
        wrong += [
            f"tensor {name!r} has dtype {reader.dtype(name)}; weights must be floating point: {list(FLOAT_DTYPES)}"
            for name in full
            if reader.dtype(name) not in FLOAT_DTYPES
        ]
        problems += wrong
        if wrong:
            continue
        arrays = [reader.read(name) for name in full]
        problems += [
            f"tensor {name!r} holds {np.size(a) - np.count_nonzero(np.isfinite(a))} NaN or infinite values"
            for name, a in zip(full, arrays)
            if not np.isfinite(a).all()
        ]
        arrays = map_.to_keras(arrays)
        assignments.append((map_, [np.asarray(a).astype(w.dtype) for a, w in zip(arrays, map_.weights)]))
    for name, source in _tied(head, task).items():
        if name in names:
            used.add(name)
            source = source if source in names else prefix + source
            if source in names and not np.array_equal(reader.read(name), reader.read(source)):
                problems.append(f"tensor {name!r} differs from {source!r}: kzoo ties the two, so it cannot hold both")
    if problems:
        more = len(problems) - _MAX_LISTED
        listed = problems[:_MAX_LISTED] + ([f"... and {more} more"] if more > 0 else [])
        sources = ", ".join(reader.sources()) or "no tensors"
        raise CheckpointError(f"Cannot load {path} ({sources}):\n- " + "\n- ".join(listed))
    for map_, values in assignments:
        for weight, value in zip(map_.weights, values):
            weight.assign(value)
    leftover = sorted(
        name
        for name in names - used
        if not name.endswith(family.ignored) and not name.startswith(family.ignored_prefixes)
    )
    notes = []
    if leftover:
        notes.append(f"not used (the kzoo model has no place for them): {leftover}")
    if fresh:
        notes.append(f"not in the checkpoint, so newly initialized: {fresh}")
    if notes:
        warnings.warn(f"Loading {path}: tensors " + "; tensors ".join(notes), stacklevel=4)


def save(path, tensors, config, tokenizer_files=None):
    """Writes `config.json` and `model.safetensors` (and, through `tokenizer_files(path)`, the
    tokenizer) into a new folder `path`, replacing nothing, all or nothing (`kzoo.files.atomic_folder`)."""
    from safetensors.numpy import save_file

    try:
        with files.atomic_folder(path, hint="choose a new one") as staging:
            save_file(
                {name: np.ascontiguousarray(array) for name, array in tensors.items()},
                str(staging / WEIGHTS_FILE),
                metadata={"format": "pt"},
            )
            (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            if tokenizer_files is not None:
                tokenizer_files(staging)
    except files.FolderExistsError as error:
        raise CheckpointError(str(error)) from error


def values(map_):
    """The current values of a map's weights as float32 NumPy arrays, as the model computes with
    them: those of quantized layers through the layers' own calls (their stored integers and
    scales dequantized), others as stored (with LoRA)."""
    if not any(getattr(layer, "quantization_mode", None) for layer in map_.layers):
        return [np.asarray(weight.numpy(), "float32") for weight in map_.weights]
    return [array for layer in map_.layers for array in _called_weights(layer)]


def _called_weights(layer):
    """`[kernel]` or `[kernel, bias]` of a Dense / EinsumDense, or `[table]` of an Embedding, as
    its call computes them: on one-hot inputs, which an int8 layer's input quantization keeps exact."""
    from keras import ops

    if hasattr(layer, "input_dim"):  # an Embedding: its rows, looked up
        return [np.asarray(ops.convert_to_numpy(layer(ops.arange(layer.input_dim))), "float32")]
    kernel_shape = tuple(layer.kernel.shape)
    bias = None if getattr(layer, "bias", None) is None else np.asarray(layer.bias.numpy(), "float32")
    input_shape = _input_shape(layer, kernel_shape)
    eye = np.eye(math.prod(input_shape), dtype="float32").reshape(-1, *input_shape)  # one row per input unit
    output = np.asarray(ops.convert_to_numpy(layer(eye[None]))[0], "float32")
    kernel = output.reshape(kernel_shape) - (0 if bias is None else bias)
    return [kernel] + ([] if bias is None else [bias])


def _input_shape(layer, kernel_shape):
    """The shape of one input row of a Dense (`(d,)`) or an EinsumDense (its contracted axes)."""
    if not hasattr(layer, "equation"):
        return kernel_shape[:1]
    inputs, kernel = layer.equation.split("->")[0].split(",")
    sizes = dict(zip(kernel, kernel_shape))
    return tuple(sizes[axis] for axis in inputs if axis in kernel)


def family_for(backbone):
    """The `Family` that writes `backbone`: its `model_type`'s, else the first that can."""
    model_type = getattr(backbone, "model_type", None)
    if model_type in FAMILIES and isinstance(backbone, FAMILIES[model_type].backbone_cls):
        return FAMILIES[model_type]
    problems = []
    for family in FAMILIES.values():
        if not isinstance(backbone, family.backbone_cls):
            continue
        try:
            family.hf_config(backbone)
        except CheckpointError as error:
            problems.append(str(error))
            continue
        return family
    writable = sorted({f.backbone_cls.__name__ for f in FAMILIES.values()})
    raise CheckpointError(
        f"This {type(backbone).__name__} has no Hugging Face counterpart; kzoo writes {writable} and their "
        "tasks" + (":\n- " + "\n- ".join(problems) if problems else ".")
    )


def hf_state(model):
    """A kzoo backbone or task as a Hugging Face checkpoint: `(config, tensors, family, head)`,
    the `config.json` dict and `{name: float32 array}` (quantized layers dequantized, as their own
    calls compute with them)."""
    backbone = getattr(model, "backbone", model)
    family = family_for(backbone)
    is_task = model is not backbone
    head = head_of(family, type(model)) if is_task else None
    if is_task and head is None:
        raise CheckpointError(
            f"{type(model).__name__} has no Hugging Face counterpart; write its backbone "
            f"(`model.backbone.export_to_transformers(path)`) or one of {sorted(family.heads)}."
        )
    prefix = family.prefixes[0] if head is not None and head.backbone_prefix else ""
    tensors, dropped = {}, []
    if head is not None:
        for map_ in head.tensors(model):
            tensors.update(zip(map_.names, map_.to_hf(values(map_))))
    for map_ in family.backbone_tensors(backbone):
        if head is not None and not head.has_optional and map_.names[0].startswith(family.optional_prefixes):
            dropped += list(map_.names)
            continue
        arrays = map_.to_hf(values(map_))
        tensors.update({prefix + name: array.astype("float32") for name, array in zip(map_.names, arrays)})
    if dropped:
        warnings.warn(f"{head.architectures[0]} has no {dropped}: not written.", stacklevel=4)
    config = {
        **family.hf_config(backbone),
        **(head.hf_config(model) if head is not None else {}),
        "model_type": family.model_type,
        "architectures": [head.architectures[0] if head is not None else family.backbone_architecture],
        "torch_dtype": "float32",
    }
    tokenizer = getattr(model, "tokenizer", None)
    # Special ids a family leaves to the tokenizer (None in its config), from the tokenizer.
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if tokenizer is not None and key in config and config[key] is None:
            value = getattr(tokenizer, key, None)
            config[key] = None if value is None else int(value)
    return config, tensors, family, head


def export_to_transformers(model, path):
    """Writes the kzoo backbone or task `model` as a Hugging Face folder; see `Backbone.export_to_transformers`."""
    from kzoo.models import hf_tokenizer

    config, tensors, family, _ = hf_state(model)
    tokenizer = getattr(model, "tokenizer", None)
    writer = None if tokenizer is None else hf_tokenizer.tokenizer_writer(tokenizer, family.model_type)
    save(path, tensors, config, writer)
