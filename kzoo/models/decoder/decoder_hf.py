"""The Llama lineage in Hugging Face's layout: config fields and tensor names for kzoo's decoder.

One tensor map serves every family here: Llama (and SmolLM, which is Llama), Mistral, Qwen2,
Qwen3, Gemma, Gemma 2, Gemma 3 and Phi-3 name their tensors alike (`model.layers.<i>.self_attn.q_proj`,
..., where Phi-3 fuses two pairs), and the optional ones follow the config: query/key/value biases (Qwen2), `q_norm` /
`k_norm` (Qwen3, Gemma 3), and Gemma 2/3's four norms per block, whose
`post_attention_layernorm` follows the attention where the others' precedes the MLP. What
differs is each `model_type`'s config: its fields, their defaults, and the settings fixed by the
architecture (the family's record in `kzoo.checkpoints.families`). `transformers` stores
`nn.Linear` weights as `(out, in)`, the transpose of a Keras kernel; kzoo keeps the attention
projections per head, a reshape.

`gemma3` (Gemma 3 with its vision tower) is read for its text decoder: the config's
`text_config`, the tensors under `model.language_model.` (or `language_model.model.`, as the
published checkpoints name them); the vision tower's tensors are not loaded. A backbone is
written back as its own `model_type` (`DecoderBackbone.model_type`), and only if that type
holds every setting of the backbone (checked by reading the written config back).
"""

import functools
import inspect
import re

from kzoo.checkpoints import families
from kzoo.checkpoints import tensor_maps
from kzoo.checkpoints.errors import CheckpointError
from kzoo.checkpoints.hf.load import MAX_CONTEXT
from kzoo.checkpoints.hf.load import ConfigReader
from kzoo.checkpoints.tensor_maps import Family
from kzoo.checkpoints.tensor_maps import Head
from kzoo.checkpoints.tensor_maps import embedding
from kzoo.checkpoints.tensor_maps import fused_linear
from kzoo.checkpoints.tensor_maps import linear
from kzoo.checkpoints.tensor_maps import norm
from kzoo.layers.rotary_embedding import check_rope_scaling
from kzoo.models.decoder.decoder_backbone import FULL_ATTENTION
from kzoo.models.decoder.decoder_backbone import SLIDING_ATTENTION
from kzoo.models.decoder.decoder_backbone import DecoderBackbone
from kzoo.models.decoder.decoder_backbone import _check_layer_types
from kzoo.models.decoder.decoder_backbone import _check_rope_parameters

# `hidden_act` / `hidden_activation` values -> kzoo activations.
ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu_pytorch_tanh": "gelu_approximate",
    "gelu_new": "gelu_approximate",
    "gelu_fast": "gelu_approximate",
    "gelu": "gelu",
    "relu": "relu",
}
HF_ACTIVATIONS = {"silu": "silu", "gelu_approximate": "gelu_pytorch_tanh", "gelu": "gelu", "relu": "relu"}


# Each `model_type`'s settings are its record, `families.FAMILIES[model_type]`; these are the
# ones kzoo also writes (a multimodal checkpoint is read for its text decoder alone).
_FAMILIES = families.text_families()


def backbone_config(config, read, model_type=None):
    """`DecoderBackbone` arguments from a `transformers` config dict (`read`: its `ConfigReader`)."""
    model_type = model_type or config["model_type"]
    text_family = families.FAMILIES[model_type].text_family
    if text_family is not None:
        text_config = read("text_config")
        if not isinstance(text_config, dict):
            raise CheckpointError(f"{read.source} field 'text_config' must be a JSON object.")
        return backbone_config(text_config, ConfigReader(text_config, f"{read.source} text_config"), text_family)
    settings = _FAMILIES[model_type]
    hidden_dim, num_heads = read.int("hidden_size"), read.int("num_attention_heads")
    num_key_value_heads = read.int("num_key_value_heads", num_heads)
    if num_heads % num_key_value_heads:
        raise CheckpointError(
            f"{read.source} field 'num_key_value_heads' ({num_key_value_heads}) must divide "
            f"'num_attention_heads' ({num_heads})."
        )
    if read("head_dim", None) is None and hidden_dim % num_heads:
        raise CheckpointError(
            f"{read.source} field 'num_attention_heads' ({num_heads}) must divide 'hidden_size' ({hidden_dim}) "
            "where 'head_dim' is not given."
        )
    head_dim = read.int("head_dim", hidden_dim // num_heads)
    num_layers = read.int("num_hidden_layers")
    read.choice("use_bidirectional_attention", [False], False)
    kwargs = {
        "vocabulary_size": read.int("vocab_size"),
        "num_layers": num_layers,
        "num_heads": num_heads,
        "num_key_value_heads": num_key_value_heads,
        "hidden_dim": hidden_dim,
        "intermediate_dim": read.int("intermediate_size"),
        "head_dim": head_dim,
        "max_sequence_length": read.int("max_position_embeddings", maximum=MAX_CONTEXT),
        "norm_epsilon": read.number("rms_norm_eps", 1e-6),
        "activation": ACTIVATIONS[read.choice(settings.activation_field, ACTIVATIONS, _default_activation(settings))],
        "tie_embeddings": read.bool("tie_word_embeddings", settings.tie_default),
        "model_type": model_type,
        **settings.fixed,
    }
    attention_bias = settings.bias != "none" and read.bool("attention_bias", settings.bias == "qkv")
    if settings.bias == "qkv":
        kwargs.update(attention_bias=True, attention_output_bias=False)
    else:
        kwargs.update(attention_bias=attention_bias, attention_output_bias=attention_bias)
    if settings.mlp_bias:
        kwargs["feed_forward_bias"] = read.bool("mlp_bias", False)
    rope_layers = _rope_layers(read, num_layers) if settings.no_rope else None
    kwargs.update(_sliding(read, settings, num_layers, rope_layers))
    if rope_layers is not None and not all(rope_layers):
        kwargs["rope_layers"] = rope_layers
    if settings.query_scalar:
        kwargs["attention_scale"] = read.number("query_pre_attn_scalar", head_dim) ** -0.5
    if settings.soft_caps:
        kwargs["attention_soft_cap"] = read("attn_logit_softcapping", None) and read.number("attn_logit_softcapping")
        kwargs["final_logit_soft_cap"] = read("final_logit_softcapping", None) and read.number(
            "final_logit_softcapping"
        )
    kwargs["rope_parameters"] = _rope_parameters(read, settings, kwargs.get("layer_types"))
    return kwargs


def _default_activation(settings):
    return "gelu_pytorch_tanh" if settings.activation_field == "hidden_activation" else "silu"


def _rope_layers(read, num_layers):
    """SmolLM3's `no_rope_layers` as a list of bools (True: the layer applies RoPE)."""
    values = read("no_rope_layers", None)
    if values is None:
        interval = read.int("no_rope_layer_interval", 4)
        return [(i + 1) % interval != 0 for i in range(num_layers)]
    if not isinstance(values, list) or len(values) != num_layers or any(v not in (0, 1) for v in values):
        raise CheckpointError(f"{read.source} field 'no_rope_layers' must list {num_layers} values, each 0 or 1.")
    return [bool(value) for value in values]


def _sliding(read, settings, num_layers, rope_layers=None):
    """`layer_types` and `sliding_window` of a config, by the family's convention."""
    if settings.sliding == "none":
        return {}
    window = read("sliding_window", None) and read.int("sliding_window")
    layer_types = read("layer_types", None)
    if settings.sliding == "smollm3":
        # As transformers: a layer slides only under `use_sliding_window`; without `layer_types`,
        # the layers without RoPE do.
        sliding = read.bool("use_sliding_window", False) and window is not None
        if layer_types is None:
            layer_types = [SLIDING_ATTENTION if sliding and not rope else FULL_ATTENTION for rope in rope_layers]
        elif not sliding and isinstance(layer_types, list):
            layer_types = [FULL_ATTENTION] * len(layer_types)
    if settings.sliding == "qwen" and layer_types is None:
        sliding = read.bool("use_sliding_window", False)
        first = read.int("max_window_layers", num_layers, minimum=0)
        layer_types = [SLIDING_ATTENTION if sliding and i >= first else FULL_ATTENTION for i in range(num_layers)]
    elif settings.sliding == "gemma" and layer_types is None:
        pattern = read.int("sliding_window_pattern", read("_sliding_window_pattern", 2))
        layer_types = [FULL_ATTENTION if (i + 1) % pattern == 0 else SLIDING_ATTENTION for i in range(num_layers)]
    elif settings.sliding == "all":
        layer_types = [SLIDING_ATTENTION if window else FULL_ATTENTION] * num_layers
    if not isinstance(layer_types, list) or len(layer_types) != num_layers:
        raise CheckpointError(f"{read.source} field 'layer_types' must list {num_layers} layer types.")
    layer_types = [kind if kind in (FULL_ATTENTION, SLIDING_ATTENTION) else None for kind in layer_types]
    if None in layer_types:
        raise CheckpointError(
            f"{read.source} field 'layer_types' holds a type kzoo does not run; supported: "
            f"{[FULL_ATTENTION, SLIDING_ATTENTION]}."
        )
    if SLIDING_ATTENTION not in layer_types:
        return {"layer_types": layer_types}
    if window is None:
        raise CheckpointError(f"{read.source} has sliding-attention layers but no field 'sliding_window'.")
    return {"layer_types": layer_types, "sliding_window": window}


def _rope_parameters(read, settings, layer_types):
    """The rotary settings: transformers v5's `rope_parameters` (per layer type where it is
    nested), or v4's `rope_theta`, `rope_scaling` (and Gemma 3's `rope_local_base_freq`)."""
    parameters = read("rope_parameters", None)
    if parameters is None:
        parameters = {"rope_theta": read.number("rope_theta", 10000.0), **(read("rope_scaling", None) or {})}
        if read("partial_rotary_factor", None) is not None:
            parameters["partial_rotary_factor"] = read("partial_rotary_factor")
        if settings.local_rope:
            local = {"rope_theta": read.number("rope_local_base_freq", 10000.0)}
            parameters = {FULL_ATTENTION: parameters, SLIDING_ATTENTION: local}
    field = "rope_parameters" if read("rope_parameters", None) is not None else "rope_scaling"
    if not isinstance(parameters, dict):
        raise CheckpointError(f"{read.source} field {field!r} must be a JSON object; it is {parameters!r}.")
    nested = set(parameters) <= {FULL_ATTENTION, SLIDING_ATTENTION}
    if nested:
        return {kind: _rope_settings(read, field, value) for kind, value in parameters.items()}
    return _rope_settings(read, field, parameters)


def _rope_settings(read, field, settings):
    """One layer type's rotary settings, with the older `type` key as `rope_type`, checked."""
    if not isinstance(settings, dict):
        raise CheckpointError(f"{read.source} field {field!r} must hold JSON objects; it holds {settings!r}.")
    settings = dict(settings)
    if "type" in settings:  # older configs
        settings["rope_type"] = settings.pop("type")
    scaling = {k: v for k, v in settings.items() if k not in ("rope_theta", "partial_rotary_factor")}
    try:
        check_rope_scaling(scaling)
    except ValueError as error:
        raise CheckpointError(f"{read.source} field {field!r}: {error}") from error
    return settings


def hf_config(backbone, model_type=None):
    """The `transformers` config fields of a `DecoderBackbone` as `model_type` (default: its own).

    Raises:
        CheckpointError: if that `model_type` cannot hold one of the backbone's settings.
    """
    model_type = model_type or backbone.model_type
    if model_type not in _FAMILIES:
        raise CheckpointError(f"kzoo writes DecoderBackbones as {sorted(_FAMILIES)}; received {model_type!r}.")
    settings = _FAMILIES[model_type]
    config = {
        "vocab_size": backbone.vocabulary_size,
        "hidden_size": backbone.hidden_dim,
        "intermediate_size": backbone.intermediate_dim,
        "num_hidden_layers": backbone.num_layers,
        "num_attention_heads": backbone.num_heads,
        "num_key_value_heads": backbone.num_key_value_heads,
        "head_dim": backbone.head_dim,
        "max_position_embeddings": backbone.max_sequence_length,
        "rms_norm_eps": backbone.norm_epsilon,
        settings.activation_field: HF_ACTIVATIONS.get(backbone.activation, backbone.activation),
        "tie_word_embeddings": backbone.tie_embeddings,
        "rope_parameters": backbone.rope_parameters
        if settings.local_rope
        else backbone.rope_parameters.get(FULL_ATTENTION, backbone.rope_parameters.get(SLIDING_ATTENTION)),
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        # The tokenizer's, where there is one (`export_to_transformers` writes them); never a
        # family's default, which may lie outside this vocabulary.
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
    }
    if settings.bias == "all":
        config["attention_bias"] = backbone.attention_bias
    if settings.mlp_bias:
        config["mlp_bias"] = backbone.feed_forward_bias
    if settings.sliding != "none":
        config["sliding_window"] = backbone.sliding_window
    if settings.sliding in ("qwen", "gemma", "smollm3"):
        config["layer_types"] = list(backbone.layer_types)
    if settings.sliding == "smollm3":
        config["use_sliding_window"] = SLIDING_ATTENTION in backbone.layer_types
    if settings.no_rope:
        config["no_rope_layers"] = [int(rope) for rope in backbone.rope_layers or [True] * backbone.num_layers]
    if settings.sliding == "qwen":
        config["use_sliding_window"] = SLIDING_ATTENTION in backbone.layer_types
        sliding = [i for i, kind in enumerate(backbone.layer_types) if kind == SLIDING_ATTENTION]
        config["max_window_layers"] = sliding[0] if sliding else backbone.num_layers
    if settings.query_scalar:
        scale = backbone.attention_scale or backbone.head_dim**-0.5
        config["query_pre_attn_scalar"] = round(scale**-2)  # an int in transformers' configs
    if settings.soft_caps:
        config["attn_logit_softcapping"] = backbone.attention_soft_cap
        config["final_logit_softcapping"] = backbone.final_logit_soft_cap
    _check_round_trip(backbone, config, model_type)
    return config


def _check_round_trip(backbone, config, model_type):
    """Refuses a config that, read back, would not build this backbone (a setting it cannot hold)."""
    read_back = backbone_config({**config, "model_type": model_type}, ConfigReader(config, f"{model_type} config"))
    ours = backbone.get_config()
    defaults = {name: parameter.default for name, parameter in inspect.signature(DecoderBackbone).parameters.items()}
    read_back = {**defaults, **read_back}
    read_back["layer_types"] = _check_layer_types(
        read_back["layer_types"], backbone.num_layers, backbone.sliding_window
    )
    read_back["rope_parameters"] = _check_rope_parameters(
        read_back["rope_parameters"], read_back["layer_types"], backbone.head_dim
    )
    differing = {
        key: ours[key] for key in ours if key in _ARCHITECTURE_KEYS and _normal(read_back[key]) != _normal(ours[key])
    }
    if differing:
        raise CheckpointError(
            f"A {model_type!r} checkpoint cannot hold this DecoderBackbone's settings {differing}; "
            f"kzoo writes {sorted(_FAMILIES)}."
        )


# What `_check_round_trip` compares: every setting that changes the computation.
_ARCHITECTURE_KEYS = (
    "vocabulary_size",
    "num_layers",
    "num_heads",
    "num_key_value_heads",
    "hidden_dim",
    "intermediate_dim",
    "head_dim",
    "positions",
    "rope_parameters",
    "normalization",
    "norm_epsilon",
    "norm_unit_offset",
    "feed_forward",
    "activation",
    "attention_bias",
    "attention_output_bias",
    "feed_forward_bias",
    "query_key_norm",
    "attention_scale",
    "attention_soft_cap",
    "final_logit_soft_cap",
    "layer_types",
    "sliding_window",
    "rope_layers",
    "sandwich_norm",
    "scale_embeddings",
    "tie_embeddings",
)


def _normal(value):
    """A setting as compared: floats rounded (a query scale written as its scalar), rope dicts per type."""
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {key: _normal(item) for key, item in value.items() if item is not None and key != "rope_type"} | (
            {"rope_type": value["rope_type"]} if value.get("rope_type", "default") != "default" else {}
        )
    if isinstance(value, (list, tuple)):
        return [_normal(item) for item in value]
    return value


def backbone_tensors(backbone, fused=False):
    """The `LlamaModel`-style tensors of every `DecoderBackbone` weight (names without prefix);
    `fused`: with Phi-3's `qkv_proj` and `gate_up_proj`."""
    token_embedding = backbone.embedding.token_embedding
    maps = [embedding(token_embedding.embeddings, "embed_tokens.weight", token_embedding)]
    for i, block in enumerate(backbone.transformer_blocks):
        layer, attention, feed_forward = f"layers.{i}", block.self_attention, block.feed_forward
        projections = (attention.query_dense, attention.key_dense, attention.value_dense)
        maps.append(norm(block.self_attention_norm, f"{layer}.input_layernorm"))
        if fused:
            maps.append(fused_linear(projections, f"{layer}.self_attn.qkv_proj"))
        else:
            maps += [linear(dense, f"{layer}.self_attn.{n}_proj") for dense, n in zip(projections, "qkv")]
        maps.append(linear(attention.output_dense, f"{layer}.self_attn.o_proj", input_axes=2))
        if backbone.query_key_norm:
            maps += [
                norm(attention.query_norm, f"{layer}.self_attn.q_norm"),
                norm(attention.key_norm, f"{layer}.self_attn.k_norm"),
            ]
        if backbone.sandwich_norm:
            maps += [
                norm(block.self_attention_output_norm, f"{layer}.post_attention_layernorm"),
                norm(block.feed_forward_norm, f"{layer}.pre_feedforward_layernorm"),
                norm(block.feed_forward_output_norm, f"{layer}.post_feedforward_layernorm"),
            ]
        else:
            maps.append(norm(block.feed_forward_norm, f"{layer}.post_attention_layernorm"))
        if fused:
            maps.append(
                fused_linear((feed_forward.gate_dense, feed_forward.intermediate_dense), f"{layer}.mlp.gate_up_proj")
            )
        else:
            maps += [
                linear(feed_forward.gate_dense, f"{layer}.mlp.gate_proj"),
                linear(feed_forward.intermediate_dense, f"{layer}.mlp.up_proj"),
            ]
        maps.append(linear(feed_forward.output_dense, f"{layer}.mlp.down_proj"))
    return maps + [norm(backbone.final_norm, "norm")]


def _lm_head_tensors(task):
    return [] if task.backbone.tie_embeddings else [linear(task.lm_head, "lm_head")]


def _tokenizer(folder, config):
    from kzoo.checkpoints.hf import tokenizer_files  # the tokenizers library: only when one is read

    return tokenizer_files.read_llama_tokenizer(folder)


def _multimodal_config(backbone):
    raise CheckpointError("kzoo writes Gemma 3's text decoder alone, as model_type 'gemma3_text'.")


def _register(family):
    prefix_pattern = "|".join(re.escape(prefix) for prefix in family.prefixes)
    model_type, multimodal = family.model_type, family.text_family is not None
    tensor_maps.register_family(
        Family(
            model_type=model_type,
            backbone_cls=DecoderBackbone,
            backbone_architecture=family.architecture,
            backbone_config=backbone_config,
            hf_config=_multimodal_config if multimodal else lambda b: hf_config(b, model_type),
            backbone_tensors=functools.partial(backbone_tensors, fused=family.fused),
            backbone_prefix=family.prefixes,
            layer_pattern=rf"^(?:{prefix_pattern})?layers\.(\d+)\.",
            num_layers_field="num_hidden_layers",
            tokenizer=_tokenizer,
            ignored=("rotary_emb.inv_freq",),
            ignored_prefixes=family.ignored_prefixes,
            heads={
                "CausalLM": Head(
                    (family.causal_lm,),
                    tensors=_lm_head_tensors,
                    tied=lambda task: (
                        dict.fromkeys(family.lm_heads, "embed_tokens.weight") if task.backbone.tie_embeddings else {}
                    ),
                )
            },
        )
    )


for _family in families.FAMILIES.values():
    _register(_family)
