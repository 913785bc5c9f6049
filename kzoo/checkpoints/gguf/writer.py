"""Writing a Hugging Face causal LM as a GGUF file, as llama.cpp's `convert_hf_to_gguf.py` does.

`write_gguf` is `GGUFCheckpoint`'s inverse (`kzoo.checkpoints.gguf.reader`): llama.cpp's changes
to the tensors are redone (`kzoo.checkpoints.gguf.layout`), a tied output head is stored once (no
`output.weight`), and a config GGUF cannot hold is refused, naming what it cannot.
"""

import math
from pathlib import Path

import gguf
import numpy as np

from kzoo import files
from kzoo.checkpoints.errors import CheckpointError
from kzoo.checkpoints.errors import problem_lines
from kzoo.checkpoints.gguf.layout import GEMMA3_LOCAL_ROPE_THETA
from kzoo.checkpoints.gguf.layout import GEMMA3_PATTERN
from kzoo.checkpoints.gguf.layout import GEMMA3_QUERY_SCALAR
from kzoo.checkpoints.gguf.layout import SIZES
from kzoo.checkpoints.gguf.layout import TOKENS_KEY
from kzoo.checkpoints.gguf.layout import WRITTEN
from kzoo.checkpoints.gguf.layout import gemma3_layer_types
from kzoo.checkpoints.gguf.layout import gemma3_query_scalar
from kzoo.checkpoints.gguf.layout import llama_cpp_changes
from kzoo.checkpoints.gguf.layout import tensor_names
from kzoo.checkpoints.gguf.quantization import FILE_TYPES
from kzoo.checkpoints.gguf.quantization import byte_size
from kzoo.checkpoints.gguf.quantization import written_type

_V = gguf.GGUFValueType
# Tokenizer arrays whose GGUF item type llama.cpp fixes, whatever Python values they hold.
_TOKENIZER_ARRAY_TYPES = {"tokenizer.ggml.precompiled_charsmap": _V.UINT8, "tokenizer.ggml.scores": _V.FLOAT32}
_TOKENIZER_UINT32 = ("_token_id", "_count")


def write_gguf(path, config, tensors, tokenizer_fields=None, file_type="F16", *, name=None, overwrite=False):
    """Writes a Hugging Face causal LM as a GGUF file, as llama.cpp's convert_hf_to_gguf.py does.

    The file is written beside `path`, under a staging name of this writer's own, and renamed
    into place once complete (`kzoo.files.atomic_file`): a failure leaves nothing behind, and
    of two writers to one path, the file is one of theirs, whole.

    Args:
        path: the `.gguf` file to write.
        config: the model's `config.json` dict (`model_type` "llama", "mistral", "qwen2",
            "qwen3" or "gemma3_text"; transformers v4 fields or v5's `rope_parameters`).
        tensors: `{Hugging Face name: array}` of every weight (`model.embed_tokens.weight`,
            ...); a tied `lm_head.weight` may be given (it must equal the embedding) and is not
            written.
        tokenizer_fields: `{"tokenizer.*" key: value}` (see `GGUFCheckpoint.tokenizer_fields`).
        file_type: one of `FILE_TYPES`: the type of the 2-D weights. Norms and other 1-D
            tensors stay F32, and a Q8_0 row length that is not a multiple of 32 falls back to
            F16, as llama.cpp does.
        name: `general.name`; defaults to the GGUF architecture (transformers cannot load a
            `llama` file named exactly "mistral").
        overwrite: whether an existing `path` may be replaced.

    Raises:
        CheckpointError: for a model or tokenizer that cannot be written, or an existing `path`
            without `overwrite`.
        kzoo.files.FileError: when `path` cannot be written: "No space left on device: nothing
            was written to <path>." for a full disk, "Read-only file system: ..." for a
            read-only one.
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise CheckpointError(f"{path} exists; pass overwrite=True to replace it.")
    if file_type not in FILE_TYPES:
        raise CheckpointError(f"file_type must be one of {list(FILE_TYPES)}; got {file_type!r}.")
    model_type = config.get("model_type")
    if model_type not in WRITTEN:
        raise CheckpointError(f"Cannot write model_type {model_type!r} as GGUF; kzoo writes {sorted(WRITTEN)}.")
    spec = WRITTEN[model_type]
    architecture = spec.gguf_architecture
    config = _normalized_config(config, spec)
    expected = tensor_names(config, spec)
    arrays = _checked_tensors(tensors, config, expected)
    tokenizer_fields = dict(tokenizer_fields or {})
    _check_tokenizer_fields(tokenizer_fields, config["vocab_size"])
    # A staging file of this writer's own (`kzoo.files.atomic_file`): two writers to one path
    # never write into one file, and a full disk names `path`, not the staging file.
    with files.atomic_file(path, mode=None, overwrite=overwrite) as staging:
        writer = gguf.GGUFWriter(staging, architecture)
        try:
            _write_metadata(writer, config, spec, FILE_TYPES[file_type], name or architecture)
            for key, value in tokenizer_fields.items():
                writer.add_key_value(key, value, *_tokenizer_value_type(key, value))
            qtypes = {
                name: written_type(gguf_name, arrays[name], file_type) for name, (gguf_name, _) in expected.items()
            }
            for name, (gguf_name, shape) in expected.items():
                nbytes = byte_size(qtypes[name], shape)
                writer.add_tensor_info(gguf_name, shape, np.dtype(np.float32), nbytes, raw_dtype=qtypes[name])
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            for name, (gguf_name, _) in expected.items():  # one quantized tensor in memory at a time
                data = llama_cpp_changes(arrays[name], gguf_name, config, spec, to_llama_cpp=True)
                writer.write_tensor_data(gguf.quants.quantize(data, qtypes[name]))
        finally:
            writer.close()


def _rope(config, layer_type):
    """(theta, rope type, factor) of `layer_type` attention, from v5's `rope_parameters` (flat or
    per layer type) or v4's `rope_theta` / `rope_scaling` / `rope_local_base_freq`."""
    parameters = config.get("rope_parameters")
    if parameters:
        parameters = parameters.get(layer_type, parameters)
        return parameters.get("rope_theta"), parameters.get("rope_type", "default"), parameters.get("factor")
    if layer_type == "sliding_attention":
        return config.get("rope_local_base_freq", GEMMA3_LOCAL_ROPE_THETA), "default", None
    scaling = config.get("rope_scaling") or {}
    return config.get("rope_theta"), scaling.get("rope_type", scaling.get("type", "default")), scaling.get("factor")


def _normalized_config(config, spec):
    """The fields `write_gguf` needs, checked; a `CheckpointError` names what GGUF cannot hold."""
    model_type = config["model_type"]
    required = (
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
        "rms_norm_eps", "tie_word_embeddings", *(("sliding_window",) if model_type == "gemma3_text" else ()),
    )  # fmt: skip
    missing = [key for key in required if config.get(key) is None]
    if missing:
        raise CheckpointError(f"The {model_type} config lacks {missing}, which the GGUF metadata needs.")
    result = dict(config)
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    result["num_key_value_heads"] = config.get("num_key_value_heads") or heads
    small = {key: result[key] for key in SIZES if result.get(key) is not None and result[key] < 1}
    if small:
        raise CheckpointError(f"The {model_type} config's sizes must be positive; it has {small}.")
    kv_heads = result["num_key_value_heads"]
    if heads % kv_heads:
        raise CheckpointError(f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads}).")
    result["head_dim"] = config.get("head_dim") or hidden // heads
    theta, rope_type, factor = _rope(config, "full_attention")
    if theta is None:
        raise CheckpointError(f"The {model_type} config has no RoPE theta (rope_theta or rope_parameters).")
    if rope_type == "linear" and factor is None:
        raise CheckpointError(f"The {model_type} config's linear RoPE scaling has no factor.")
    result["rope_theta"], result["rope_factor"] = theta, factor if rope_type == "linear" else None
    # (field, the value the config has, the only value llama.cpp's architecture runs)
    fixed = [
        (spec.gguf.activation[0], config.get(spec.gguf.activation[0], spec.gguf.activation[1]), spec.gguf.activation[1])
    ]
    if rope_type not in ("default", "linear"):
        fixed.append(("RoPE type", rope_type, "'default' or 'linear'"))
    if model_type == "llama":
        fixed.append(("mlp_bias", bool(config.get("mlp_bias")), False))
    window = config.get("sliding_window") or math.inf
    if model_type == "mistral" and window < config.get("max_position_embeddings", 0):
        fixed.append(("sliding_window", config["sliding_window"], "None (llama.cpp's llama has no window)"))
    if model_type in ("qwen2", "qwen3"):
        fixed.append(("use_sliding_window", bool(config.get("use_sliding_window")), False))
    if model_type == "gemma3_text":
        layers = config["num_hidden_layers"]
        local_theta, local_type, _ = _rope(config, "sliding_attention")
        query_scalar = gemma3_query_scalar(layers, hidden, heads, result["head_dim"])
        fixed += [
            ("layer_types", config.get("layer_types", gemma3_layer_types(layers)), gemma3_layer_types(layers)),
            ("sliding_window_pattern", config.get("sliding_window_pattern", GEMMA3_PATTERN), GEMMA3_PATTERN),
            ("sliding-window RoPE theta", local_theta, GEMMA3_LOCAL_ROPE_THETA),
            ("sliding-window RoPE type", local_type, "default"),
            ("query_pre_attn_scalar", config.get("query_pre_attn_scalar", GEMMA3_QUERY_SCALAR), query_scalar),
            ("attn_logit_softcapping", config.get("attn_logit_softcapping"), None),
        ]
    wrong = [f"{field} is {value!r}, not {allowed!r}" for field, value, allowed in fixed if value != allowed]
    if wrong:
        raise CheckpointError(
            f"GGUF's {spec.gguf_architecture} architecture cannot hold this {model_type} config: " + "; ".join(wrong)
        )
    return result


def _checked_tensors(tensors, config, expected):
    """`tensors` as float32 arrays, all there and shaped as the config says (or an error listing what is not)."""
    arrays = {name: np.asarray(value, dtype=np.float32) for name, value in tensors.items()}
    problems = [f"tensor {name!r} is missing" for name in expected if name not in arrays]
    problems += [
        f"tensor {name!r} has shape {list(arrays[name].shape)}; the config gives {list(shape)}"
        for name, (_, shape) in expected.items()
        if name in arrays and arrays[name].shape != shape
    ]
    tied = config["tie_word_embeddings"] and "lm_head.weight" in arrays
    if tied and not np.array_equal(arrays["lm_head.weight"], arrays.get("model.embed_tokens.weight")):
        problems.append("tensor 'lm_head.weight' differs from 'model.embed_tokens.weight', but the config ties them")
    extra = sorted(set(arrays) - set(expected) - ({"lm_head.weight"} if tied else set()))
    problems += [f"tensor {name!r} is not part of a {config['model_type']} model with this config" for name in extra]
    if problems:
        raise CheckpointError("Cannot write the GGUF file:" + problem_lines(problems))
    return arrays


def _write_metadata(writer, config, spec, file_type, name):
    """The metadata llama.cpp's converter writes for these architectures (`<arch>.*`, `general.*`)."""
    writer.add_type("model")
    writer.add_name(name)
    writer.add_block_count(config["num_hidden_layers"])
    if config.get("max_position_embeddings") is not None:
        writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    # llama.cpp writes the vocabulary size for Llama only; it is written for every architecture
    # so that a file without a tokenizer still gives it to transformers.
    writer.add_vocab_size(config["vocab_size"])
    if spec.gguf.permute_qk:
        writer.add_rope_dimension_count(config["head_dim"])
    if config["rope_factor"] is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(config["rope_factor"])
    if spec.model_type == "gemma3_text":
        if config.get("final_logit_softcapping"):
            writer.add_final_logit_softcapping(config["final_logit_softcapping"])
        writer.add_sliding_window(config["sliding_window"])
    writer.add_file_type(file_type)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _tokenizer_value_type(key, value):
    """(GGUF type, array item type) llama.cpp writes the tokenizer field `key` with."""
    if isinstance(value, (list, tuple)):
        return _V.ARRAY, _TOKENIZER_ARRAY_TYPES.get(key, _V.get_type(value[0]))
    if key.endswith(_TOKENIZER_UINT32) and isinstance(value, int) and not isinstance(value, bool):
        return _V.UINT32, None
    return _V.get_type(value), None


def _check_tokenizer_fields(fields, vocab_size):
    problems = []
    for key, value in fields.items():
        items = value if isinstance(value, (list, tuple)) else [value]
        kinds = {bool if isinstance(item, bool) else type(item) for item in items}
        if not key.startswith("tokenizer."):
            problems.append(f"{key!r} is not a tokenizer field (they start with 'tokenizer.')")
        elif not items or len(kinds) != 1 or not kinds <= {str, int, float, bool}:
            problems.append(
                f"{key!r} must be a str, int, float or bool, or a non-empty list of one of them; "
                f"got {type(value).__name__} of {sorted(kind.__name__ for kind in kinds)}"
            )
        elif key.endswith(_TOKENIZER_UINT32) and kinds == {int} and not 0 <= min(items) <= max(items) < 2**32:
            problems.append(f"{key!r} is {value}, outside UINT32's range")
    tokens = fields.get(TOKENS_KEY)
    if isinstance(tokens, (list, tuple)) and len(tokens) > vocab_size:
        problems.append(f"{TOKENS_KEY} holds {len(tokens)} tokens, more than the vocabulary size {vocab_size}")
    if problems:
        raise CheckpointError("Cannot write the tokenizer fields:\n- " + "\n- ".join(problems))
