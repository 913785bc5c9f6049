"""Writing a kzoo backbone or task as a Hugging Face folder, through its family's maps."""

import json
import warnings

import numpy as np

from kzoo import files
from kzoo.checkpoints.errors import CheckpointError
from kzoo.checkpoints.hf.load import CONFIG_FILE
from kzoo.checkpoints.hf.safetensors import WEIGHTS_FILE
from kzoo.checkpoints.tensor_maps import FAMILIES
from kzoo.checkpoints.tensor_maps import head_of
from kzoo.checkpoints.tensor_maps import values


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
    from kzoo.checkpoints.hf.tokenizer_files import tokenizer_writer  # keras-hub, tokenizers: only here

    config, tensors, family, _ = hf_state(model)
    tokenizer = getattr(model, "tokenizer", None)
    writer = None if tokenizer is None else tokenizer_writer(tokenizer, family.model_type)
    save(path, tensors, config, writer)
