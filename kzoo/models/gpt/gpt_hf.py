"""GPT-2 in Hugging Face's layout: `transformers`' config fields and tensor names for kzoo's GPT.

Reads `GPT2Model` (no prefix) and `GPT2LMHeadModel` (`transformer.` prefix; its `lm_head` is
the token table, tied), and writes them. GPT-2's `Conv1D` stores weights as `(in, out)`, as a
Keras kernel does, and `c_attn` holds the query, key and value projections side by side:
`(d, 3d)`, split into kzoo's three `(d, heads, head_dim)` kernels.
"""

from kzoo.checkpoints import tensor_maps
from kzoo.checkpoints.errors import CheckpointError
from kzoo.checkpoints.tensor_maps import Family
from kzoo.checkpoints.tensor_maps import Head
from kzoo.checkpoints.tensor_maps import embedding
from kzoo.checkpoints.tensor_maps import fused_linear
from kzoo.checkpoints.tensor_maps import linear
from kzoo.checkpoints.tensor_maps import norm
from kzoo.models.gpt.gpt_backbone import GPTBackbone

# `activation_function` values -> kzoo activations ("gelu_new" is GPT-2's tanh GELU).
ACTIVATIONS = {
    "gelu_new": "gelu_approximate",
    "gelu_pytorch_tanh": "gelu_approximate",
    "gelu_fast": "gelu_approximate",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
HF_ACTIVATIONS = {"gelu_approximate": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}
# Config fields whose other values change the computation in ways kzoo does not implement.
_FIXED = {
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "add_cross_attention": False,
}


def backbone_config(config, read):
    """`GPTBackbone` arguments from a `transformers` `GPT2Config` dict (`read`: its `ConfigReader`)."""
    activation = read.choice("activation_function", ACTIVATIONS, "gelu_new")
    for key, allowed in _FIXED.items():
        read.choice(key, [allowed], allowed)
    hidden_dim, num_heads = read.int("n_embd"), read.int("n_head")
    if hidden_dim % num_heads:
        raise CheckpointError(f"{read.source} field 'n_head' ({num_heads}) must divide 'n_embd' ({hidden_dim}).")
    return {
        "vocabulary_size": read.int("vocab_size"),
        "num_layers": read.int("n_layer"),
        "num_heads": num_heads,
        "hidden_dim": hidden_dim,
        "intermediate_dim": read.int("n_inner", 4 * hidden_dim),
        "max_sequence_length": read.int("n_positions"),
        "dropout": read.rate("resid_pdrop", 0.1),
        "layer_norm_epsilon": read.number("layer_norm_epsilon", 1e-5),
        "activation": ACTIVATIONS[activation],
    }


def hf_config(backbone):
    """The `GPT2Config` fields of a `GPTBackbone`."""
    if backbone.activation not in HF_ACTIVATIONS:
        raise CheckpointError(
            f"GPTBackbone activation {backbone.activation!r} has no transformers `activation_function`; "
            f"writable: {sorted(HF_ACTIVATIONS)}."
        )
    return {
        "vocab_size": backbone.vocabulary_size,
        "n_layer": backbone.num_layers,
        "n_head": backbone.num_heads,
        "n_embd": backbone.hidden_dim,
        "n_inner": backbone.intermediate_dim,
        "n_positions": backbone.max_sequence_length,
        "activation_function": HF_ACTIVATIONS[backbone.activation],
        "layer_norm_epsilon": backbone.layer_norm_epsilon,
        "resid_pdrop": backbone.dropout,
        "embd_pdrop": backbone.dropout,
        "attn_pdrop": backbone.dropout,
        "tie_word_embeddings": True,
        "initializer_range": 0.02,
    }


def backbone_tensors(backbone):
    """The `GPT2Model` tensors of every `GPTBackbone` weight."""
    maps = [
        embedding(backbone.embedding.token_embedding.embeddings, "wte.weight", backbone.embedding.token_embedding),
        embedding(backbone.embedding.position_embedding.position_embeddings, "wpe.weight"),
    ]
    for i, block in enumerate(backbone.transformer_blocks):
        attention = block.self_attention
        maps += [
            norm(block.self_attention_norm, f"h.{i}.ln_1"),
            fused_linear(
                (attention.query_dense, attention.key_dense, attention.value_dense),
                f"h.{i}.attn.c_attn",
                transposed=False,
            ),
            linear(attention.output_dense, f"h.{i}.attn.c_proj", input_axes=2, transposed=False),
            norm(block.feed_forward_norm, f"h.{i}.ln_2"),
            linear(block.feed_forward.intermediate_dense, f"h.{i}.mlp.c_fc", transposed=False),
            linear(block.feed_forward.output_dense, f"h.{i}.mlp.c_proj", transposed=False),
        ]
    return maps + [norm(backbone.final_norm, "ln_f")]


def _tokenizer(folder, config):
    from kzoo.checkpoints.hf import tokenizer_files  # keras-hub's tokenizers: only when one is read

    return tokenizer_files.read_gpt2_tokenizer(folder)


tensor_maps.register_family(
    Family(
        model_type="gpt2",
        backbone_cls=GPTBackbone,
        backbone_architecture="GPT2Model",
        backbone_config=backbone_config,
        hf_config=hf_config,
        backbone_tensors=backbone_tensors,
        backbone_prefix="transformer.",
        layer_pattern=r"^(?:transformer\.)?h\.(\d+)\.",
        num_layers_field="n_layer",
        tokenizer=_tokenizer,
        # The causal mask as a buffer, in checkpoints written by older transformers.
        ignored=(".attn.bias", ".attn.masked_bias"),
        heads={"GPTCausalLM": Head(("GPT2LMHeadModel",), tied={"lm_head.weight": "wte.weight"})},
    )
)
