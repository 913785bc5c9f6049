"""Loading a Hugging Face folder (or a GGUF file read as one) into a kzoo backbone or task.

A folder holds `config.json` and the weights as `model.safetensors` or as shards listed in
`model.safetensors.index.json` (`kzoo.checkpoints.hf.safetensors`), plus the tokenizer's files.
Its `model_type` names the registered `Family` (`kzoo.checkpoints.tensor_maps`) whose maps read it.

Loading is all or nothing, and a file from outside is not trusted:

- every config field is checked (type and range) and errors name the file and the field;
- before anything is built, the layer count of the config must match the tensors', and the
  model the config describes must not need more values than the files hold;
- the model is built with shapes but no values; every tensor is checked (present, shaped as
  the config says, floating point) before any is read, then read, checked (finite) and set one
  map at a time; all problems are reported together with the file and tensor names, and the
  model is returned only once everything is in place. Tensors the kzoo model has no place
  for (e.g. BERT's next-sentence head) are named in a warning.
"""

import json
import math
import re
import warnings
from pathlib import Path

import numpy as np

from kzoo import _compat
from kzoo.checkpoints import arrays
from kzoo.checkpoints.errors import CheckpointError
from kzoo.checkpoints.errors import problem_lines
from kzoo.checkpoints.hf.safetensors import FLOAT_DTYPES
from kzoo.checkpoints.hf.safetensors import SafetensorsReader
from kzoo.checkpoints.tensor_maps import FAMILIES
from kzoo.checkpoints.tensor_maps import head_of

CONFIG_FILE = "config.json"
# How many more values than the files hold a config may describe (a head or pooler the
# checkpoint lacks, which is newly initialized) before it is refused unbuilt.
_SIZE_SLACK = 0.05
_MIN_SIZE_SLACK = 2**20


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


# The longest context a config may declare: the longest published is 10M tokens (Llama 4
# Scout); a larger one (a GGUF's `context_length` of 2^32 - 1) is a corrupt file, which would make
# every default sized by the context (an export's cache) absurd.
MAX_CONTEXT = 2**24


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

    def int(self, key, default=_REQUIRED, minimum=1, maximum=None):
        value = self(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self._error(key, value, f"an integer >= {minimum}")
        if maximum is not None and value > maximum:
            raise self._error(key, value, f"an integer in [{minimum}, {maximum}]")
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


def load(cls, path, kwargs, reader=None, config=None, source=None):
    """A kzoo backbone or task of class `cls` with the weights (and tokenizer) of a checkpoint.

    See `from_preset`. Tasks get the task kwargs `kwargs` (a task's head config, e.g.
    `num_classes`, defaults to the checkpoint's when it has that head), and their backbone the
    `dtype` among them; backbones take them as config overrides (e.g. `dropout`, `dtype`).

    Args:
        cls: the kzoo class to build.
        path: a Hugging Face folder, or where `reader` and `config` come from.
        kwargs: as above.
        reader: None (the folder's safetensors) or a reader with `names()`, `shape(name)`,
            `dtype(name)`, `values()`, `sources()` and `read(name, order)` (a GGUF file's).
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
    backbone_kwargs = {**family.backbone_config(config, read), **(backbone_part(kwargs) if is_task else dict(kwargs))}
    reader = SafetensorsReader(path) if reader is None else reader
    _check_layers(reader, family, backbone_kwargs, source)
    head = head_of(family, cls) if is_task else None
    architectures = config.get("architectures") or []
    head_in_checkpoint = head is not None and bool(set(head.architectures) & set(architectures))
    task_kwargs = {}
    if is_task:
        task_kwargs = dict(kwargs)
        if head_in_checkpoint:
            task_kwargs = {**head.task_config(config), **task_kwargs}
    # Built with shapes but no values: nothing is allocated before the sizes are checked, and each
    # weight's memory is filled once, from the file, instead of first with random values.
    with _compat.deferred_variables() as variables:
        backbone = family.backbone_cls(**backbone_kwargs)
    _check_size(backbone, reader, source)
    if is_task:
        if "tokenizer" not in task_kwargs:
            task_kwargs["tokenizer"] = checkpoint_tokenizer(family, path, config, backbone.vocabulary_size)
        with _compat.deferred_variables() as task_variables:
            model = cls(backbone=backbone, **task_kwargs)
        variables += task_variables
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
    for variable in variables:  # those the checkpoint has no value for: their own initializers'
        _compat.set_variable(variable, None)
    if head_maps and not head_in_checkpoint:
        warnings.warn(
            f"{path} holds no {head.architectures[0]} head (its architectures: {architectures}): "
            f"the head of {cls.__name__} is newly initialized; fine-tune it before use.",
            stacklevel=3,
        )
    return model


def backbone_part(task_kwargs):
    """The arguments of a task's `from_preset` that its backbone takes too: its `dtype`, as
    keras-hub forwards it, so that `CausalLM.from_preset(path, dtype="bfloat16")` holds its
    weights in bfloat16 rather than a float32 backbone under a bfloat16 task."""
    return {"dtype": task_kwargs["dtype"]} if task_kwargs.get("dtype") is not None else {}


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


def _check_size(backbone, reader, source):
    """Refuses a config that needs far more values than the checkpoint holds, before allocating them
    (`backbone`'s variables have shapes but no memory yet)."""
    needed = sum(math.prod(variable.shape) for variable in backbone.weights)
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


def _all_finite(array):
    """Whether every value of `array` is finite: a NaN or infinity makes the sum NaN or infinite, so a
    finite sum (one pass, no array of booleans as large as the tensor) settles it; only a sum that
    overflows is checked value by value."""
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(np.sum(array))) or bool(np.isfinite(array).all())


def _contiguous(array, dtype, rows=256):
    """`array` as a C-contiguous array of `dtype` in memory a variable can adopt (`arrays.shareable`):
    `array` itself where it already is one, else a copy; a transposed view is copied a band of rows
    of the original at a time, which keeps the reads and writes within the caches (twice as fast as
    one strided copy)."""
    array = np.asarray(array)
    if array.dtype == dtype and arrays.shareable(array):
        return array
    if array.ndim != 2 or array.flags.c_contiguous or not array.T.flags.c_contiguous:
        return arrays.copy(array, dtype)
    out = arrays.empty(array.shape, dtype)
    source = array.T  # contiguous, (columns, rows) of `out`
    for start in range(0, source.shape[0], rows):
        out[:, start : start + rows] = source[start : start + rows].T
    return out


def _load_weights(backbone_maps, head_maps, reader, family, head, path, task=None):
    """Checks every map's tensors (present, shaped, floating point), then reads, checks (finite)
    and sets them one map at a time, so that only one map's arrays are in memory beside the
    model. Any problem raises a `CheckpointError` listing them all; the caller's model is then
    dropped, so a half-set model is never returned."""
    names = reader.names()
    prefix = _backbone_prefix(names, family)
    used, problems, fresh, ready = set(), [], [], []
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
        if not wrong:
            ready.append((map_, full))
    for name, source in _tied(head, task).items():
        if name in names:
            used.add(name)
            source = source if source in names else prefix + source
            if source in names and not np.array_equal(reader.read(name), reader.read(source)):
                problems.append(f"tensor {name!r} differs from {source!r}: kzoo ties the two, so it cannot hold both")
    for map_, full in [] if problems else ready:
        orders = ["F" if name in map_.transposed else "C" for name in map_.names]
        values = [reader.read(name, order) for name, order in zip(full, orders)]
        problems += [
            f"tensor {name!r} holds {np.size(a) - np.count_nonzero(np.isfinite(a))} NaN or infinite values"
            for name, a in zip(full, values)
            if not _all_finite(a)
        ]
        if not problems:
            given = []  # each variable adopts memory of its own: one a map gives twice is copied
            for weight, value in zip(map_.weights, map_.to_keras(values)):
                value = _contiguous(value, weight.dtype)
                if any(np.may_share_memory(value, other) for other in given):
                    value = arrays.copy(value)
                given.append(value)
                _compat.set_variable(weight, arrays.variable_value(value))
        del values
    if problems:
        sources = ", ".join(reader.sources()) or "no tensors"
        raise CheckpointError(f"Cannot load {path} ({sources}):" + problem_lines(problems))
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
