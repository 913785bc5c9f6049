"""One record per decoder family (`model_type`): everything kzoo knows about it, in one place.

A `Family` holds how the family's Hugging Face config reads into a `DecoderBackbone` (the
settings the architecture fixes and the conventions of its fields), how its tensors are named
in Hugging Face's and llama.cpp's layouts, how llama.cpp names its architecture and what that
means for a GGUF vocabulary, and a tiny random model of it for the tests. `FAMILIES` maps each
`model_type` to its record; the readers and writers (`decoder_hf`, `kzoo.checkpoints.gguf`,
`kzoo.checkpoints.gguf.tokenizer`) and every test suite read it, so a new family is one record here.

This module is plain data: it imports no Keras model code, so checkpoint readers below the
models import it without a cycle.

>>> FAMILIES["qwen2"].causal_lm
'Qwen2ForCausalLM'
>>> by_gguf_architecture("gemma3").model_type
'gemma3_text'
>>> sorted(written_as_gguf())
['gemma3_text', 'llama', 'mistral', 'qwen2', 'qwen3']
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class GGUFLayout:
    """A family as llama.cpp writes it: the architecture and how its tensors differ.

    Attributes:
        layer_names: `{Hugging Face name inside model.layers.N: GGUF name inside blk.N}`.
        qkv_bias: whether q, k and v always have biases (Qwen2).
        bias_flag: whether the config's `attention_bias` adds q, k, v and o biases.
        qk_norm: whether queries and keys have a per-head RMSNorm.
        permute_qk: whether llama.cpp reorders the query and key rows for its RoPE.
        norm_shift: what llama.cpp adds to every norm weight.
        activation: (config field, the only activation llama.cpp runs for it).
        fixed: settings llama.cpp's implementation fixes and the file does not hold.
        reads_back_as: where llama.cpp has no architecture of its own for the family, the family
            its files read back as (Mistral is Llama to llama.cpp); None where they read as it.
    """

    layer_names: dict
    qkv_bias: bool = False
    bias_flag: bool = True
    qk_norm: bool = False
    permute_qk: bool = False
    norm_shift: float = 0.0
    activation: tuple = ("hidden_act", "silu")
    fixed: dict = dataclasses.field(default_factory=dict)
    reads_back_as: str | None = None


# The sizes every tiny model starts from (`Tiny.hf` adds each family's own fields): a test's size, with
# grouped KV heads (4 query heads sharing 2).
TINY_BASE = dict(
    vocab_size=300,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


@dataclasses.dataclass(frozen=True)
class Tiny:
    """A tiny random model of the family, as the test suites build it.

    Attributes:
        config: the `transformers` config class ("LlamaConfig").
        hf: its fields over `TINY_BASE`, so that every setting that makes the family
            acts within a dozen tokens (windows of 4, llama3 scaling from 8 positions).
        variants: more checkpoints of the family, `{suffix: fields}` over the base sizes alone
            ("tied": a Llama with tied embeddings and nothing else of `hf`).
        gguf: the fields of the GGUF round trips (every row a multiple of 32, Q8_0's block), or
            None where kzoo writes no GGUF of the family.
        backbone: `DecoderBackbone` arguments the shared causal-LM suite sets over what it reads
            from `hf` (settings the checkpoint tests leave at their defaults).
    """

    config: str
    hf: dict = dataclasses.field(default_factory=dict)
    variants: dict = dataclasses.field(default_factory=dict)
    gguf: dict | None = None
    backbone: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Family:
    """How one `model_type` differs.

    Attributes:
        model_type: the Hugging Face `model_type`.
        architecture: the bare backbone's `transformers` class ("LlamaModel").
        causal_lm: the task's `transformers` class ("LlamaForCausalLM").
        tiny: the tests' tiny model (`Tiny`).
        fixed: DecoderBackbone arguments the architecture fixes.
        tie_default: `tie_word_embeddings` where the config does not say.
        activation_field: "hidden_act" or "hidden_activation" (Gemma, where a config without it
            runs the tanh GELU).
        bias: how `attention_bias` reads: "all" (q, k, v and o: Llama, Qwen3, Gemma), "qkv"
            (Qwen2: always on q, k, v, never on o), "none" (Mistral).
        sliding: "none", "all" (Mistral: every layer slides when `sliding_window` is set),
            "qwen" (`use_sliding_window` from `max_window_layers` on), "gemma" (`layer_types`,
            or every `sliding_window_pattern`-th layer full) or "smollm3" (`layer_types` under
            `use_sliding_window`, or the layers without RoPE).
        query_scalar: reads `query_pre_attn_scalar` (Gemma 2/3: the query scale is its -1/2 power).
        soft_caps: reads `attn_logit_softcapping` and `final_logit_softcapping` (Gemma 2/3).
        local_rope: sliding layers have a RoPE base of their own (`rope_local_base_freq`, Gemma 3).
        mlp_bias: reads `mlp_bias` (Llama).
        fused: the query, key and value projections are one tensor, `qkv_proj`, and the gate and
            up projections another, `gate_up_proj` (Phi-3).
        no_rope: reads `no_rope_layers` (1 where a layer applies RoPE), or every
            `no_rope_layer_interval`-th layer without it (SmolLM3).
        text_family: for a multimodal checkpoint, the family of its text decoder (`text_config`),
            the only part kzoo reads; None for a text model.
        prefixes: where the decoder's tensors sit in a Hugging Face checkpoint.
        lm_heads: the output head's tensor names (tied to the embeddings where the config says).
        ignored_prefixes: tensors kzoo does not read (a vision tower).
        gguf_architecture: llama.cpp's `general.architecture` for the family, or None.
        gguf: how kzoo reads and writes the family as GGUF (`GGUFLayout`), or None where it does not.
        gemma_vocabulary: a SentencePiece vocabulary of this family (a GGUF "llama" one, or a
            folder's `tokenizer.model`) splits as Gemma's (GGUF: and has Gemma's `<mask>` token).
    """

    model_type: str
    architecture: str
    causal_lm: str
    tiny: Tiny
    fixed: dict = dataclasses.field(default_factory=dict)
    tie_default: bool = False
    activation_field: str = "hidden_act"
    bias: str = "all"
    sliding: str = "none"
    query_scalar: bool = False
    soft_caps: bool = False
    local_rope: bool = False
    mlp_bias: bool = False
    fused: bool = False
    no_rope: bool = False
    text_family: str | None = None
    prefixes: tuple = ("model.",)
    lm_heads: tuple = ("lm_head.weight",)
    ignored_prefixes: tuple = ()
    gguf_architecture: str | None = None
    gguf: GGUFLayout | None = None
    gemma_vocabulary: bool = False


# llama.cpp's tensor names inside `blk.N`, by Hugging Face's inside `model.layers.N`.
_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",  # Llama's norm before the feed-forward
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_QK_NORM_NAMES = {"self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
# Gemma's four norms a block: before and after each sublayer.
_GEMMA_LAYER_NAMES = {
    **_LAYER_NAMES,
    **_QK_NORM_NAMES,
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
_LLAMA_GGUF = GGUFLayout(_LAYER_NAMES, permute_qk=True)
_GEMMA = dict(norm_unit_offset=True, scale_embeddings=True)
_GEMMA_FIELDS = dict(tie_default=True, activation_field="hidden_activation", gemma_vocabulary=True)
_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8,
}
_GEMMA3_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0},
}
# The GGUF round trips' layers and heads; Qwen 3 keeps head_dim 128 and Gemma 3 head_dim 256 =
# query_pre_attn_scalar (transformers' GGUF loader reads neither and uses those defaults), and
# Gemma 3's 6 layers include a global one (the 6th) with a window shorter than the inputs.
_GGUF_LAYERS = dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)

FAMILIES = {
    family.model_type: family
    for family in (
        Family(
            "llama",
            "LlamaModel",
            "LlamaForCausalLM",
            Tiny(
                "LlamaConfig",
                dict(rope_parameters=_LLAMA3_ROPE, attention_bias=True, mlp_bias=True),
                variants={"tied": dict(tie_word_embeddings=True)},
                gguf=_GGUF_LAYERS,
            ),
            mlp_bias=True,
            gguf_architecture="llama",
            gguf=_LLAMA_GGUF,
        ),
        Family(
            "mistral",
            "MistralModel",
            "MistralForCausalLM",
            Tiny(
                "MistralConfig",
                dict(sliding_window=4),
                gguf={**_GGUF_LAYERS, "num_key_value_heads": 1, "sliding_window": None},
            ),
            bias="none",
            sliding="all",
            # llama.cpp writes Mistral as Llama, without attention biases.
            gguf_architecture="llama",
            gguf=dataclasses.replace(_LLAMA_GGUF, bias_flag=False, reads_back_as="llama"),
        ),
        Family(
            "qwen2",
            "Qwen2Model",
            "Qwen2ForCausalLM",
            Tiny(
                "Qwen2Config",
                dict(use_sliding_window=True, sliding_window=4, max_window_layers=1),
                gguf={**_GGUF_LAYERS, "tie_word_embeddings": True},
            ),
            bias="qkv",
            sliding="qwen",
            gguf_architecture="qwen2",
            gguf=GGUFLayout(_LAYER_NAMES, qkv_bias=True, bias_flag=False),
        ),
        Family(
            "qwen3",
            "Qwen3Model",
            "Qwen3ForCausalLM",
            Tiny(
                "Qwen3Config",
                dict(head_dim=16, rope_parameters={"rope_type": "linear", "rope_theta": 1000.0, "factor": 2.0}),
                gguf={**_GGUF_LAYERS, "head_dim": 128},
            ),
            fixed={"query_key_norm": True},
            sliding="qwen",
            gguf_architecture="qwen3",
            gguf=GGUFLayout({**_LAYER_NAMES, **_QK_NORM_NAMES}, qk_norm=True),
        ),
        Family(
            "phi3",
            "Phi3Model",
            "Phi3ForCausalLM",
            Tiny(
                "Phi3Config",
                dict(
                    sliding_window=4,
                    pad_token_id=0,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
                ),
            ),
            bias="none",
            sliding="all",
            fused=True,
            gguf_architecture="phi3",
        ),
        Family(
            "smollm3",
            "SmolLM3Model",
            "SmolLM3ForCausalLM",
            # Layer 1 has no RoPE and slides (transformers' rule without `layer_types`).
            Tiny(
                "SmolLM3Config",
                dict(
                    no_rope_layer_interval=2, use_sliding_window=True, sliding_window=4, mlp_bias=True, pad_token_id=0
                ),
            ),
            tie_default=True,
            mlp_bias=True,
            sliding="smollm3",
            no_rope=True,
            gguf_architecture="smollm3",
        ),
        Family(
            "gemma",
            "GemmaModel",
            "GemmaForCausalLM",
            Tiny("GemmaConfig", dict(head_dim=16)),
            fixed=_GEMMA,
            gguf_architecture="gemma",
            **_GEMMA_FIELDS,
        ),
        Family(
            "gemma2",
            "Gemma2Model",
            "Gemma2ForCausalLM",
            Tiny(
                "Gemma2Config",
                dict(
                    head_dim=16,
                    sliding_window=4,
                    query_pre_attn_scalar=12,
                    attn_logit_softcapping=5.0,
                    final_logit_softcapping=3.0,
                ),
            ),
            fixed={**_GEMMA, "sandwich_norm": True},
            sliding="gemma",
            query_scalar=True,
            soft_caps=True,
            gguf_architecture="gemma2",
            **_GEMMA_FIELDS,
        ),
        Family(
            "gemma3_text",
            "Gemma3TextModel",
            "Gemma3ForCausalLM",
            Tiny(
                "Gemma3TextConfig",
                dict(
                    head_dim=16,
                    sliding_window=4,
                    query_pre_attn_scalar=12,
                    layer_types=["sliding_attention", "full_attention"],
                    rope_parameters=_GEMMA3_ROPE,
                ),
                gguf=dict(num_hidden_layers=6, num_attention_heads=2, num_key_value_heads=1, sliding_window=8),
                backbone=dict(attention_soft_cap=8.0, final_logit_soft_cap=6.0),
            ),
            fixed={**_GEMMA, "sandwich_norm": True, "query_key_norm": True},
            sliding="gemma",
            query_scalar=True,
            soft_caps=True,
            local_rope=True,
            gguf_architecture="gemma3",
            gguf=GGUFLayout(
                _GEMMA_LAYER_NAMES,
                qk_norm=True,
                norm_shift=1.0,
                activation=("hidden_activation", "gelu_pytorch_tanh"),
                # llama.cpp's Gemma 3 (llama-model.cpp): every sixth layer attends globally, the
                # sliding-window layers' RoPE base is 10,000, and queries are scaled by
                # 1/sqrt(head_dim), except at 62 layers (Gemma 3 27B), by 1/sqrt(hidden / heads);
                # 256 is transformers' default query_pre_attn_scalar.
                fixed=dict(
                    sliding_window_pattern=6,
                    rope_local_base_freq=10000.0,
                    wide_query_layers=62,
                    query_pre_attn_scalar=256,
                ),
            ),
            **_GEMMA_FIELDS,
        ),
        # Gemma 3 with its vision tower: the text decoder of `text_config`.
        Family(
            "gemma3",
            "Gemma3ForConditionalGeneration",
            "Gemma3ForConditionalGeneration",
            Tiny(
                "Gemma3Config",
                dict(
                    vision_config=dict(
                        hidden_size=16,
                        intermediate_size=32,
                        num_hidden_layers=1,
                        num_attention_heads=2,
                        image_size=28,
                        patch_size=14,
                    ),
                    mm_tokens_per_image=4,
                ),
            ),
            text_family="gemma3_text",
            # As transformers v5 and the published checkpoints name them.
            prefixes=("model.language_model.", "language_model.model."),
            lm_heads=("lm_head.weight", "language_model.lm_head.weight"),
            ignored_prefixes=(
                "model.vision_tower.",
                "model.multi_modal_projector.",
                "vision_tower.",
                "multi_modal_projector.",
            ),
            gguf_architecture="gemma3",
            gemma_vocabulary=True,
        ),
    )
}


def text_families():
    """The families kzoo writes as their own `model_type` (every one but the multimodal readings)."""
    return {model_type: family for model_type, family in FAMILIES.items() if family.text_family is None}


def written_as_gguf():
    """`{model_type: family}` of the families kzoo writes as GGUF."""
    return {model_type: family for model_type, family in FAMILIES.items() if family.gguf is not None}


def by_gguf_architecture(architecture):
    """The family a GGUF file of llama.cpp's `architecture` reads as, or None where kzoo reads none."""
    return gguf_architectures().get(architecture)


def gguf_architectures():
    """`{GGUF architecture: family}` of every architecture kzoo reads, in `FAMILIES`' order."""
    return {
        family.gguf_architecture: family for family in written_as_gguf().values() if family.gguf.reads_back_as is None
    }


def gemma_vocabulary_architectures():
    """The GGUF architectures whose "llama" vocabulary is Gemma's."""
    return tuple(dict.fromkeys(f.gguf_architecture for f in FAMILIES.values() if f.gemma_vocabulary))
