"""BERT in Hugging Face's layout: `transformers`' config fields and tensor names for kzoo's BERT.

Reads `BertModel` and the sentence-transformers layout (no prefix), `BertForMaskedLM`,
`BertForPreTraining` (its next-sentence head is reported unused),
`BertForSequenceClassification` and `BertForTokenClassification` (`bert.` prefix), and writes
`BertModel` for a backbone and the matching architecture for each task. `transformers` stores
`nn.Linear` weights as `(out, in)`, the transpose of a Keras kernel; the attention projections
are kept per head in kzoo (`(d, heads, head_dim)`), a reshape of the same numbers.
"""

from kzoo.checkpoints import tensor_maps
from kzoo.checkpoints.errors import CheckpointError
from kzoo.checkpoints.tensor_maps import Family
from kzoo.checkpoints.tensor_maps import Head
from kzoo.checkpoints.tensor_maps import embedding
from kzoo.checkpoints.tensor_maps import linear
from kzoo.checkpoints.tensor_maps import norm
from kzoo.models.bert.bert_backbone import BertBackbone

# `hidden_act` values -> kzoo activations. "gelu" is the exact (erf) GELU, as transformers runs it.
ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_approximate",
    "gelu_pytorch_tanh": "gelu_approximate",
    "gelu_fast": "gelu_approximate",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_approximate": "gelu_new", "relu": "relu", "silu": "silu"}


def backbone_config(config, read):
    """`BertBackbone` arguments from a `transformers` `BertConfig` dict (`read`: its `ConfigReader`)."""
    hidden_act = read.choice("hidden_act", ACTIVATIONS, "gelu")
    read.choice("position_embedding_type", ["absolute"], "absolute")
    read.choice("is_decoder", [False], False)
    read.choice("add_cross_attention", [False], False)
    hidden_dim, num_heads = read.int("hidden_size"), read.int("num_attention_heads")
    if hidden_dim % num_heads:
        raise CheckpointError(
            f"{read.source} field 'num_attention_heads' ({num_heads}) must divide 'hidden_size' ({hidden_dim})."
        )
    return {
        "vocabulary_size": read.int("vocab_size"),
        "num_layers": read.int("num_hidden_layers"),
        "num_heads": num_heads,
        "hidden_dim": hidden_dim,
        "intermediate_dim": read.int("intermediate_size"),
        "max_sequence_length": read.int("max_position_embeddings"),
        "num_segments": read.int("type_vocab_size", 2),
        "dropout": read.rate("hidden_dropout_prob", 0.1),
        "activation": ACTIVATIONS[hidden_act],
        "layer_norm_epsilon": read.number("layer_norm_eps", 1e-12),
    }


def hf_config(backbone):
    """The `BertConfig` fields of a `BertBackbone`."""
    if backbone.activation not in HF_ACTIVATIONS:
        raise CheckpointError(
            f"BertBackbone activation {backbone.activation!r} has no transformers `hidden_act`; "
            f"writable: {sorted(HF_ACTIVATIONS)}."
        )
    return {
        "vocab_size": backbone.vocabulary_size,
        "num_hidden_layers": backbone.num_layers,
        "num_attention_heads": backbone.num_heads,
        "hidden_size": backbone.hidden_dim,
        "intermediate_size": backbone.intermediate_dim,
        "max_position_embeddings": backbone.max_sequence_length,
        "type_vocab_size": backbone.num_segments,
        "hidden_act": HF_ACTIVATIONS[backbone.activation],
        "layer_norm_eps": backbone.layer_norm_epsilon,
        "hidden_dropout_prob": backbone.dropout,
        "attention_probs_dropout_prob": backbone.dropout,
        "position_embedding_type": "absolute",
        "pad_token_id": 0,
        "initializer_range": 0.02,
    }


def backbone_tensors(backbone):
    """The `BertModel` tensors of every `BertBackbone` weight."""
    maps = [
        embedding(
            backbone.embedding.token_embedding.embeddings,
            "embeddings.word_embeddings.weight",
            backbone.embedding.token_embedding,
        ),
        embedding(backbone.embedding.position_embedding.position_embeddings, "embeddings.position_embeddings.weight"),
        embedding(
            backbone.segment_embedding.embeddings, "embeddings.token_type_embeddings.weight", backbone.segment_embedding
        ),
        norm(backbone.embedding_norm, "embeddings.LayerNorm"),
    ]
    for i, block in enumerate(backbone.transformer_blocks):
        layer = f"encoder.layer.{i}"
        attention = block.self_attention
        maps += [
            linear(attention.query_dense, f"{layer}.attention.self.query"),
            linear(attention.key_dense, f"{layer}.attention.self.key"),
            linear(attention.value_dense, f"{layer}.attention.self.value"),
            linear(attention.output_dense, f"{layer}.attention.output.dense", input_axes=2),
            norm(block.self_attention_norm, f"{layer}.attention.output.LayerNorm"),
            linear(block.feed_forward.intermediate_dense, f"{layer}.intermediate.dense"),
            linear(block.feed_forward.output_dense, f"{layer}.output.dense"),
            norm(block.feed_forward_norm, f"{layer}.output.LayerNorm"),
        ]
    return maps + [linear(backbone.pooler, "pooler.dense")]


def _masked_lm_tensors(task):
    return [
        linear(task.transform_dense, "cls.predictions.transform.dense"),
        norm(task.transform_norm, "cls.predictions.transform.LayerNorm"),
        tensor_maps.TensorMap((task.lm_head.bias,), ("cls.predictions.bias",), list, list),
    ]


def _classifier_tensors(task):
    return [linear(task.output_dense, "classifier")]


def _num_labels(config):
    labels = config.get("id2label") or {}
    return {"num_classes": len(labels) or config.get("num_labels", 2)}


def _labels(task):
    return {"id2label": {str(i): f"LABEL_{i}" for i in range(task.num_classes)}}


def _tokenizer(folder, config):
    from kzoo.checkpoints.hf import tokenizer_files  # keras-hub's tokenizers: only when one is read

    return tokenizer_files.read_bert_tokenizer(folder)


tensor_maps.register_family(
    Family(
        model_type="bert",
        backbone_cls=BertBackbone,
        backbone_architecture="BertModel",
        backbone_config=backbone_config,
        hf_config=hf_config,
        backbone_tensors=backbone_tensors,
        backbone_prefix="bert.",
        layer_pattern=r"^(?:bert\.)?encoder\.layer\.(\d+)\.",
        num_layers_field="num_hidden_layers",
        tokenizer=_tokenizer,
        optional_prefixes=("pooler.",),
        # Buffers, not weights: position ids (older checkpoints) and the decoder's copy of
        # the output bias.
        ignored=("embeddings.position_ids",),
        heads={
            "BertMaskedLM": Head(
                ("BertForMaskedLM", "BertForPreTraining"),
                tensors=_masked_lm_tensors,
                tied={
                    "cls.predictions.decoder.weight": "embeddings.word_embeddings.weight",
                    "cls.predictions.decoder.bias": "cls.predictions.bias",
                },
                has_optional=False,
            ),
            "BertClassifier": Head(
                ("BertForSequenceClassification",),
                tensors=_classifier_tensors,
                task_config=_num_labels,
                hf_config=_labels,
            ),
            "BertTokenClassifier": Head(
                ("BertForTokenClassification",),
                tensors=_classifier_tensors,
                task_config=_num_labels,
                hf_config=_labels,
                has_optional=False,
            ),
        },
    )
)
