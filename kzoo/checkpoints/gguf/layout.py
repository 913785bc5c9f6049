"""What the GGUF reader and writer share: llama.cpp's layout of a Hugging Face model.

Which families map to which GGUF architecture (each family's record in
`kzoo.checkpoints.families`), the GGUF name and Hugging Face shape of every tensor a config
implies, the settings llama.cpp's Gemma 3 fixes, and what llama.cpp changes in the tensors:
- Llama's query and key rows: llama.cpp pairs rotary dimensions `(2i, 2i + 1)` (Meta's
  layout), where Hugging Face pairs `(i, i + d/2)`;
- Gemma's RMSNorm weights, stored as `1 + w` (Hugging Face's `Gemma3RMSNorm` adds the 1).

>>> names = tensor_names(dict(hidden_size=8, num_attention_heads=2, vocab_size=10, intermediate_size=16,
...                           num_hidden_layers=1, tie_word_embeddings=True), ARCHITECTURES["llama"])
>>> names["model.layers.0.self_attn.q_proj.weight"]
('blk.0.attn_q.weight', (8, 8))
"""

import re

import numpy as np

from kzoo.checkpoints import families

SUPPORTED_ARCHITECTURES = tuple(families.gguf_architectures())
# Config fields that count something: a GGUF that says 0 of them is refused.
SIZES = (
    "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
)  # fmt: skip
# GGUF architecture -> the family it reads as, and Hugging Face model_type -> the family written;
# each family's GGUF layout is its record's `gguf` (`kzoo.checkpoints.families`).
ARCHITECTURES = families.gguf_architectures()
WRITTEN = families.written_as_gguf()
# What llama.cpp's Gemma 3 fixes (the record's `gguf.fixed`).
_GEMMA3_FIXED = families.FAMILIES["gemma3_text"].gguf.fixed
GEMMA3_PATTERN = _GEMMA3_FIXED["sliding_window_pattern"]
GEMMA3_LOCAL_ROPE_THETA = _GEMMA3_FIXED["rope_local_base_freq"]
_GEMMA3_27B_LAYERS = _GEMMA3_FIXED["wide_query_layers"]
GEMMA3_QUERY_SCALAR = _GEMMA3_FIXED["query_pre_attn_scalar"]
TOKENS_KEY = "tokenizer.ggml.tokens"


def tensor_names(config, spec):
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


def llama_cpp_changes(weights, gguf_name, config, spec, to_llama_cpp):
    """Makes (`to_llama_cpp`) or undoes llama.cpp's changes to the tensor `gguf_name`."""
    heads = _rope_heads(gguf_name, config) if spec.gguf.permute_qk else None
    if heads is not None:
        weights = _permute_rope_rows(weights, heads, to_llama_cpp)
    if spec.gguf.norm_shift and gguf_name.endswith("norm.weight"):
        shift = np.float32(spec.gguf.norm_shift)
        weights = weights + shift if to_llama_cpp else weights - shift
    return weights


def gemma3_layer_types(layers):
    return ["full_attention" if (index + 1) % GEMMA3_PATTERN == 0 else "sliding_attention" for index in range(layers)]


def gemma3_query_scalar(layers, hidden, heads, head_dim):
    return hidden // heads if layers == _GEMMA3_27B_LAYERS else head_dim
