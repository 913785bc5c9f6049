"""Old import paths of modules that moved: each leaves a short file at its old path.

`MOVED` maps each old module to its new homes. The old module answers every name of those
modules with a `DeprecationWarning` naming where it lives now. kzoo's own code, recipes,
scripts and tests import only the new paths (tests/test_layout.py checks), so the warning
reaches only users' code. Saved `.keras` files name classes by their registered names, not
by module, so moving a module never breaks them.
"""

import importlib
import warnings

MOVED = {
    "kzoo.models.decoder.families": ("kzoo.checkpoints.families",),
    "kzoo.data.characters": ("kzoo.tokenizers.characters",),
    "kzoo.data.tokenizers": ("kzoo.tokenizers.word_piece",),
    "kzoo.data.tokenizer_json": ("kzoo.tokenizers.tokenizer_json",),
    "kzoo.models.bpe_pipelines": ("kzoo.tokenizers.byte_pair",),
    "kzoo.models.chat_template": ("kzoo.tokenizers.chat_template",),
    "kzoo.models.text_inputs": ("kzoo.tokenizers.packing",),
    "kzoo.models.hf_tokenizer": (
        "kzoo.tokenizers.bert",
        "kzoo.tokenizers.hugging_face",
        "kzoo.checkpoints.hf.tokenizer_files",
    ),
    "kzoo.models.gguf_tokenizer": ("kzoo.checkpoints.gguf.tokenizer",),
    "kzoo.models.hf_checkpoint": (
        "kzoo.checkpoints.errors",
        "kzoo.checkpoints.tensor_maps",
        "kzoo.checkpoints.hf.safetensors",
        "kzoo.checkpoints.hf.load",
        "kzoo.checkpoints.hf.save",
    ),
    "kzoo.models.gguf_checkpoint": (
        "kzoo.checkpoints.errors",
        "kzoo.checkpoints.gguf.reader",
        "kzoo.checkpoints.gguf.writer",
        "kzoo.checkpoints.gguf.layout",
        "kzoo.checkpoints.gguf.quantization",
        "kzoo.checkpoints.gguf.header",
    ),
    "kzoo.models.keras_hub_weights": ("kzoo.checkpoints.keras_hub",),
    "kzoo.export.tflite_conversion": ("kzoo.export.tflite.convert", "kzoo.export.tflite.graph_passes"),
}


def moved(old):
    """The module `__getattr__` of the old module `old`: each name found in its new homes, in order."""
    new = MOVED[old]

    def __getattr__(name):
        if not name.startswith("__"):
            for module_name in new:
                module = importlib.import_module(module_name)
                if hasattr(module, name):
                    warnings.warn(
                        f"{old}.{name} moved to {module_name}.{name}; import it from there.",
                        DeprecationWarning,
                        stacklevel=2,
                    )
                    return getattr(module, name)
        raise AttributeError(f"module {old!r} has no attribute {name!r} (it moved to {', '.join(new)})")

    return __getattr__
