"""Hugging Face checkpoints: local folders in `transformers`' layout, read and written.

A folder holds `config.json` and the weights as `model.safetensors` or as shards listed in
`model.safetensors.index.json`, plus the tokenizer's files (see `kzoo.models.hf_tokenizer`).
Weights are read with the `safetensors` package into NumPy: loading never needs torch.

Each model family (`kzoo/models/bert/bert_hf.py`, `kzoo/models/gpt/gpt_hf.py`) registers a
`Family`: which `model_type` it reads, how a `config.json` becomes kzoo constructor arguments
and back, and a list of `TensorMap`s pairing Hugging Face tensor names with kzoo variables.
The same maps serve reading and writing, so the two directions cannot drift apart.

Loading is all or nothing: every tensor of the checkpoint is read and checked (present, shaped
as the config says) before any weight is set, all problems are reported together with the file
and tensor names, and the model only exists once everything is in place. Tensors the kzoo model
has no place for (e.g. BERT's next-sentence head) are named in a warning.
"""

import dataclasses
import json
import math
import warnings
from pathlib import Path

import numpy as np

from kzoo import files

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
_TORCH_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack")
# Problems listed in one error before "... and N more".
_MAX_LISTED = 12

FAMILIES = {}


class CheckpointError(ValueError):
    """A Hugging Face folder kzoo cannot read or write; the message names the file and the tensor or field."""


@dataclasses.dataclass(frozen=True, eq=False)
class TensorMap:
    """Hugging Face tensors `names` hold the values of the kzoo variables `weights`.

    Attributes:
        weights: tuple of kzoo variables (e.g. a `Dense`'s kernel and bias).
        names: tuple of Hugging Face tensor names (without the model's prefix).
        to_keras: `f(list of Hugging Face arrays) -> list of arrays, one per variable`.
        to_hf: `f(list of variable values) -> list of Hugging Face arrays`, its inverse.
    """

    weights: tuple
    names: tuple
    to_keras: object
    to_hf: object


def linear(layer, name, input_axes=1, transposed=True):
    """`name.weight` / `name.bias` of a `torch.nn.Linear` (`(out, in)`, `transposed`) or of
    GPT-2's `Conv1D` (`(in, out)`) as the kernel and bias of a Keras `Dense` or `EinsumDense`,
    whose kernel's first `input_axes` axes are the input ones."""
    kernel_shape = tuple(layer.kernel.shape)
    bias_shape = tuple(layer.bias.shape)
    inputs = math.prod(kernel_shape[:input_axes])

    def to_keras(arrays):
        weight, bias = arrays
        weight = weight.T if transposed else weight
        return [weight.reshape(kernel_shape), bias.reshape(bias_shape)]

    def to_hf(arrays):
        kernel, bias = arrays
        weight = kernel.reshape(inputs, -1)
        return [weight.T if transposed else weight, bias.reshape(-1)]

    return TensorMap((layer.kernel, layer.bias), (f"{name}.weight", f"{name}.bias"), to_keras, to_hf)


def layer_norm(layer, name):
    """`name.weight` / `name.bias` as a `LayerNormalization`'s gamma and beta."""
    return TensorMap((layer.gamma, layer.beta), (f"{name}.weight", f"{name}.bias"), list, list)


def embedding(table, name):
    """The tensor `name` as the embedding table `table` (a variable)."""
    return TensorMap((table,), (name,), list, list)


@dataclasses.dataclass(frozen=True)
class Family:
    """What kzoo knows of one `model_type`. The functions take the kzoo model (or its backbone).

    Attributes:
        model_type: the `config.json` `model_type`, e.g. "bert".
        backbone_cls: the kzoo backbone class.
        backbone_architecture: the `transformers` class of the bare backbone, e.g. "BertModel".
        backbone_config: `f(config dict, read) -> kzoo constructor kwargs`, where
            `read(key, default=REQUIRED)` gives a field or raises a `CheckpointError` naming it.
        hf_config: `f(backbone) -> config dict` (architecture fields only).
        backbone_tensors: `f(backbone) -> [TensorMap]`, names without prefix.
        backbone_prefix: the prefix of the backbone's tensors inside a task model
            ("bert." / "transformer."); a bare backbone has none.
        optional_prefixes: tensor name prefixes (without the backbone prefix) that a
            checkpoint may lack; the layers keep their initialization and a warning names them
            (e.g. BERT's pooler, which `BertForMaskedLM` does not have).
        ignored: tensor name suffixes that are buffers, not weights (never reported).
        heads: `{task class name: Head}`.
    """

    model_type: str
    backbone_cls: type
    backbone_architecture: str
    backbone_config: object
    hf_config: object
    backbone_tensors: object
    backbone_prefix: str
    optional_prefixes: tuple = ()
    ignored: tuple = ()
    heads: dict = dataclasses.field(default_factory=dict)


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
        tied: `{name: backbone tensor name}`: tensors a checkpoint may hold as a copy of a tied
            one; they must equal it, since kzoo ties them.
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


def is_hf_folder(path):
    """Whether `path` is a folder with a `transformers` `config.json` (one with a `model_type`)."""
    config = Path(path) / CONFIG_FILE
    if not config.is_file():
        return False
    try:
        return "model_type" in json.loads(config.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return False


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


def config_reader(config, path):
    """`read(key, default)`: a config field, or a `CheckpointError` naming the file and field."""
    required = object()

    def read(key, default=required):
        if key in config and config[key] is not None:
            return config[key]
        if default is required:
            raise CheckpointError(f"{Path(path) / CONFIG_FILE} lacks the field {key!r}.")
        return default

    return read


def family_of(config, path):
    """The registered `Family` of a checkpoint's `model_type`."""
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise CheckpointError(
            f"{Path(path) / CONFIG_FILE} has model_type {model_type!r}, which kzoo cannot load; "
            f"supported: {sorted(FAMILIES)}."
        )
    return FAMILIES[model_type]


class SafetensorsReader:
    """The tensors of a folder's `model.safetensors` (or its shards), read on demand as NumPy arrays."""

    def __init__(self, path):
        from safetensors import safe_open  # Only loading and saving checkpoints needs it.

        path = Path(path)
        self.files = {}  # tensor name -> file
        index = path / WEIGHTS_INDEX_FILE
        if (path / WEIGHTS_FILE).is_file():
            shards = [path / WEIGHTS_FILE]
        elif index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (ValueError, KeyError, TypeError) as error:
                raise CheckpointError(f"{index} is not a safetensors index (a JSON 'weight_map'): {error}") from error
            shards = sorted({path / name for name in weight_map.values()})
        else:
            torch_files = [name for name in _TORCH_FILES if (path / name).is_file()]
            hint = (
                f" It holds {torch_files}: convert it to safetensors first (e.g. load it with transformers and "
                "`save_pretrained(folder, safe_serialization=True)`); kzoo reads no pickled weights."
                if torch_files
                else ""
            )
            raise CheckpointError(f"{path} has no {WEIGHTS_FILE} and no {WEIGHTS_INDEX_FILE}.{hint}")
        self._handles = {}
        for shard in shards:
            if not shard.is_file():
                raise CheckpointError(f"{index} lists the shard {shard.name}, which is missing.")
            try:
                handle = safe_open(str(shard), framework="numpy")
                names = list(handle.keys())
            except Exception as error:  # safetensors raises its own SafetensorError
                raise CheckpointError(
                    f"{shard} is not a readable safetensors file ({error}); it may be truncated or corrupt."
                ) from error
            self._handles[shard] = handle
            for name in names:
                self.files[name] = shard

    def names(self):
        return set(self.files)

    def shape(self, name):
        return tuple(self._handles[self.files[name]].get_slice(name).get_shape())

    def read(self, name):
        try:
            return self._handles[self.files[name]].get_tensor(name)
        except Exception as error:
            raise CheckpointError(f"Cannot read tensor {name!r} from {self.files[name]}: {error}") from error


def load(cls, path, kwargs):
    """A kzoo backbone or task of class `cls` with the weights (and tokenizer) of the folder `path`.

    See `from_preset`. Tasks get the task kwargs `kwargs` (a task's head config, e.g.
    `num_classes`, defaults to the checkpoint's when it has that head); backbones take them as
    config overrides (e.g. `dropout`, `dtype`).
    """
    from kzoo.models import hf_tokenizer  # keras-hub tokenizers: only here

    config = read_config(path)
    family = family_of(config, path)
    backbone_cls = getattr(cls, "backbone_cls", None)
    is_task = backbone_cls is not None
    wanted = backbone_cls if is_task else cls
    if not issubclass(family.backbone_cls, wanted):
        raise CheckpointError(
            f"{Path(path) / CONFIG_FILE} holds a {family.model_type!r} model, which "
            f"{family.backbone_cls.__name__} and its tasks load, not {cls.__name__}."
        )
    reader = SafetensorsReader(path)
    read = config_reader(config, path)
    backbone_kwargs = {} if is_task else dict(kwargs)
    backbone = family.backbone_cls(**{**family.backbone_config(config, read), **backbone_kwargs})
    head = family.heads.get(cls.__name__) if is_task else None
    architectures = config.get("architectures") or []
    head_in_checkpoint = head is not None and bool(set(head.architectures) & set(architectures))
    if is_task:
        task_kwargs = dict(kwargs)
        if head_in_checkpoint:
            task_kwargs = {**head.task_config(config), **task_kwargs}
        if "tokenizer" not in task_kwargs:
            task_kwargs["tokenizer"] = hf_tokenizer.load_tokenizer(
                path, config, vocabulary_size=backbone.vocabulary_size
            )
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
    )
    if head_maps and not head_in_checkpoint:
        warnings.warn(
            f"{path} holds no {head.architectures[0]} head (its architectures: {architectures}): "
            f"the head of {cls.__name__} is newly initialized; fine-tune it before use.",
            stacklevel=3,
        )
    return model


def _backbone_prefix(names, family):
    prefixed = sum(name.startswith(family.backbone_prefix) for name in names)
    return family.backbone_prefix if prefixed > len(names) / 2 else ""


def _load_weights(backbone_maps, head_maps, reader, family, head, path):
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
        weights = map_.weights
        expected = [a.shape for a in map_.to_hf([np.zeros(w.shape, "float32") for w in weights])]
        wrong = [
            f"tensor {name!r} has shape {list(reader.shape(name))}; the config gives {list(want)}"
            for name, want in zip(full, expected)
            if reader.shape(name) != tuple(want)
        ]
        problems += wrong
        if not wrong:
            arrays = map_.to_keras([reader.read(name) for name in full])
            assignments.append((map_, [np.asarray(a).astype(w.dtype) for a, w in zip(arrays, weights)]))
    for name, source in (head.tied if head is not None else {}).items():
        if name in names:
            used.add(name)
            source = source if source in names else prefix + source
            if source in names and not np.array_equal(reader.read(name), reader.read(source)):
                problems.append(f"tensor {name!r} differs from {source!r}: kzoo ties the two, so it cannot hold both")
    if problems:
        more = len(problems) - _MAX_LISTED
        listed = problems[:_MAX_LISTED] + ([f"... and {more} more"] if more > 0 else [])
        raise CheckpointError(f"Cannot load {_weights_description(reader, path)}:\n- " + "\n- ".join(listed))
    for map_, values in assignments:
        for weight, value in zip(map_.weights, values):
            weight.assign(value)
    leftover = sorted(name for name in names - used if not name.endswith(family.ignored))
    notes = []
    if leftover:
        notes.append(f"not used (the kzoo model has no place for them): {leftover}")
    if fresh:
        notes.append(f"not in the checkpoint, so newly initialized: {fresh}")
    if notes:
        warnings.warn(f"Loading {path}: tensors " + "; tensors ".join(notes), stacklevel=4)


def _weights_description(reader, path):
    files = sorted({file.name for file in reader.files.values()})
    return f"{path} ({', '.join(files) or 'no tensors'})"


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


def export_to_transformers(model, path):
    """Writes the kzoo backbone or task `model` as a Hugging Face folder; see `Backbone.export_to_transformers`."""
    from kzoo.models import hf_tokenizer

    backbone = getattr(model, "backbone", model)
    family = next((f for f in FAMILIES.values() if isinstance(backbone, f.backbone_cls)), None)
    if family is None:
        raise CheckpointError(
            f"{type(backbone).__name__} has no Hugging Face counterpart; kzoo writes "
            f"{sorted(f.backbone_cls.__name__ for f in FAMILIES.values())} and their tasks."
        )
    is_task = model is not backbone
    head = family.heads.get(type(model).__name__) if is_task else None
    if is_task and head is None:
        raise CheckpointError(
            f"{type(model).__name__} has no Hugging Face counterpart; write its backbone "
            f"(`model.backbone.export_to_transformers(path)`) or one of {sorted(family.heads)}."
        )
    prefix = family.backbone_prefix if head is not None and head.backbone_prefix else ""
    tensors, dropped = {}, []
    if head is not None:
        for map_ in head.tensors(model):
            arrays = map_.to_hf([np.asarray(w.numpy()) for w in map_.weights])
            tensors.update(zip(map_.names, arrays))
    for map_ in family.backbone_tensors(backbone):
        if head is not None and not head.has_optional and map_.names[0].startswith(family.optional_prefixes):
            dropped += list(map_.names)
            continue
        arrays = map_.to_hf([np.asarray(w.numpy()) for w in map_.weights])
        tensors.update({prefix + name: array.astype("float32") for name, array in zip(map_.names, arrays)})
    if dropped:
        warnings.warn(f"{head.architectures[0]} has no {dropped}: not written.", stacklevel=3)
    config = {
        **family.hf_config(backbone),
        **(head.hf_config(model) if head is not None else {}),
        "model_type": family.model_type,
        "architectures": [head.architectures[0] if head is not None else family.backbone_architecture],
        "torch_dtype": "float32",
    }
    tokenizer = getattr(model, "tokenizer", None)
    writer = None
    if tokenizer is not None:
        writer = hf_tokenizer.tokenizer_writer(tokenizer, family.model_type)
    save(path, tensors, config, writer)
