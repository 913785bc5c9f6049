"""Tiny model configurations and batches shared by the model tests."""

import functools

import numpy as np

from kzoo import models
from kzoo.checkpoints.families import FAMILIES
from kzoo.checkpoints.hf.load import ConfigReader
from kzoo.models.decoder import decoder_hf

VOCABULARY_SIZE = 40
MASK_ID = VOCABULARY_SIZE - 1  # BERT's [MASK]; 0 is padding.
BATCH = 4
LENGTH = 10
NUM_CLASSES = 3
TASKS = ("GPTCausalLM", "BertMaskedLM", "BertClassifier", "BertTokenClassifier")

TINY_CONFIG = dict(
    vocabulary_size=VOCABULARY_SIZE,
    num_layers=2,
    num_heads=2,
    hidden_dim=16,
    intermediate_dim=32,
    max_sequence_length=16,
    dropout=0.0,
)


def gpt_backbone(**overrides):
    return models.GPTBackbone(**{**TINY_CONFIG, **overrides})


def bert_backbone(**overrides):
    return models.BertBackbone(**{**TINY_CONFIG, **overrides})


def padding_mask(lengths, length=LENGTH):
    """`(len(lengths), length)` int mask, 1 for the first `lengths[i]` positions."""
    return (np.arange(length)[None, :] < np.asarray(lengths)[:, None]).astype("int32")


def token_ids(rng, batch=BATCH, length=LENGTH):
    """Random ids in [1, MASK_ID): never padding, never [MASK]."""
    return rng.integers(1, MASK_ID, (batch, length)).astype("int32")


def bert_inputs(ids, mask):
    return {"token_ids": ids * mask, "segment_ids": np.zeros_like(ids), "padding_mask": mask}


def task_batch(name, seed=0, **backbone_overrides):
    """A tiny task model and one padded training batch: `(model, x, y, sample_weight)`."""
    rng = np.random.default_rng(seed)
    mask = padding_mask([LENGTH, LENGTH, 7, 5])
    if name == "GPTCausalLM":
        ids = token_ids(rng, length=LENGTH + 1)
        model = models.GPTCausalLM(gpt_backbone(**backbone_overrides))
        x = {"token_ids": ids[:, :-1] * mask, "padding_mask": mask}
        return model, x, ids[:, 1:] * mask, mask
    if name == "Seq2SeqTransformer":  # padding is id 0 in both sequences
        layers = dict(num_encoder_layers=2, num_decoder_layers=2)
        config = {key: value for key, value in TINY_CONFIG.items() if key != "num_layers"}
        backbone = models.Seq2SeqBackbone(**{**config, **layers, **backbone_overrides})
        target = token_ids(rng, length=LENGTH + 1)
        x = {"encoder_token_ids": token_ids(rng) * mask, "decoder_token_ids": target[:, :-1] * mask}
        return models.Seq2SeqTransformer(backbone), x, target[:, 1:] * mask, mask
    ids = token_ids(rng) * mask
    backbone = bert_backbone(**backbone_overrides)
    if name == "BertMaskedLM":
        positions = np.array([[1, 4, 6], [0, 2, 9], [3, 5, 0], [1, 2, 0]], "int32")
        weights = np.array([[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 1, 0]], "int32")
        masked = ids.copy()
        np.put_along_axis(masked, positions, MASK_ID, axis=1)
        x = {**bert_inputs(masked, mask), "mask_positions": positions}
        return models.BertMaskedLM(backbone), x, np.take_along_axis(ids, positions, axis=1), weights
    if name == "BertClassifier":
        model = models.BertClassifier(backbone, num_classes=NUM_CLASSES, dropout=0.0)
        return model, bert_inputs(ids, mask), np.array([0, 1, 2, 1], "int32"), None
    if name == "BertTokenClassifier":
        model = models.BertTokenClassifier(backbone, num_classes=NUM_CLASSES, dropout=0.0)
        labels = rng.integers(0, NUM_CLASSES, ids.shape).astype("int32")
        return model, bert_inputs(ids, mask), labels * mask, mask
    raise ValueError(name)


# One tiny backbone per decoder family: GPT-2's, and every record of `kzoo.checkpoints.families`
# read from its tiny Hugging Face config (`Family.tiny.hf`, at these sizes) as a checkpoint is, so
# that each has the settings that make it that family; the shared causal-LM tests
# (tests/models/test_causal_lm.py) run every one. Each ties its output head to the embeddings, as a
# DecoderBackbone does by default: an untied head lies outside the backbone, so the backbone's LoRA
# would leave it training (transformers' untied heads are checked in test_decoder_hf.py).
_HF_BASE = dict(
    tie_word_embeddings=True,
    vocab_size=VOCABULARY_SIZE,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=16,
)


def decoder_backbone(model_type, layers=None, **sizes):
    """The tiny `DecoderBackbone` of a family, as kzoo reads its tiny config (a multimodal one's
    text decoder) with `sizes` (config fields) over the base sizes, and the record's
    `tiny.backbone` settings over it; `layers` blocks, where given (the record's layer types
    repeated)."""
    family = FAMILIES[model_type]
    text = FAMILIES[family.text_family or model_type]
    config = {"model_type": model_type, **_HF_BASE, **sizes, **text.tiny.hf}
    if layers is not None:
        config["num_hidden_layers"] = layers
        if "layer_types" in config:
            config["layer_types"] = [config["layer_types"][i % len(config["layer_types"])] for i in range(layers)]
    if family.text_family is not None:
        config = {"model_type": model_type, **family.tiny.hf, "text_config": config}
    arguments = decoder_hf.backbone_config(config, ConfigReader(config, f"the tiny {model_type} config"))
    return models.DecoderBackbone(**{**arguments, **text.tiny.backbone})


DECODERS = {
    "gpt2": lambda: models.GPTBackbone(**TINY_CONFIG),
    **{model_type: functools.partial(decoder_backbone, model_type) for model_type in FAMILIES},
}
