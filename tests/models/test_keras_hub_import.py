"""Importing keras-hub preset directories: same outputs, clear errors."""

import shutil

import keras_hub
import numpy as np
import pytest

from kzoo import models

HUB_CONFIG = dict(
    vocabulary_size=97, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32, max_sequence_length=24
)


@pytest.fixture(scope="module")
def hub_presets(tmp_path_factory):
    """Random small keras-hub backbones and the preset directories they were saved to."""
    saved = {}
    for name, hub_cls in (("bert", keras_hub.models.BertBackbone), ("gpt2", keras_hub.models.GPT2Backbone)):
        hub_backbone = hub_cls(**HUB_CONFIG)
        directory = tmp_path_factory.mktemp(name)
        hub_backbone.save_to_preset(str(directory))
        saved[name] = (hub_backbone, str(directory))
    return saved


def _padded_batch(segments=False):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, HUB_CONFIG["vocabulary_size"], (3, 12)).astype("int32")
    mask = (np.arange(12)[None, :] < np.array([[12], [7], [3]])).astype("int32")
    inputs = {"token_ids": ids, "padding_mask": mask}
    if segments:
        inputs["segment_ids"] = np.repeat((np.arange(12) >= 5).astype("int32")[None], 3, axis=0)
    return inputs, mask.astype(bool)


def _max_abs_difference(a, b, where=None):
    difference = np.abs(np.asarray(a) - np.asarray(b))
    return float((difference if where is None else difference[where]).max())


def test_bert_outputs_match_keras_hub(hub_presets):
    hub_backbone, directory = hub_presets["bert"]
    backbone = models.BertBackbone.from_preset(directory)
    assert backbone.get_config()["num_segments"] == 2
    inputs, real = _padded_batch(segments=True)
    expected, outputs = hub_backbone(inputs), backbone(inputs)
    # Padded positions are undefined in both models: compare at real tokens.
    assert _max_abs_difference(outputs["sequence_output"], expected["sequence_output"], real) <= 1e-5
    assert _max_abs_difference(outputs["pooled_output"], expected["pooled_output"]) <= 1e-5
    fresh = models.BertBackbone(**HUB_CONFIG)(inputs)["pooled_output"]
    assert _max_abs_difference(fresh, expected["pooled_output"]) > 1e-2  # the weights did move


def test_gpt2_outputs_and_logits_match_keras_hub(hub_presets):
    hub_backbone, directory = hub_presets["gpt2"]
    lm = models.GPTCausalLM.from_preset(directory)
    inputs, real = _padded_batch()
    assert _max_abs_difference(lm.backbone(inputs), hub_backbone(inputs), real) <= 1e-5
    hub_lm = keras_hub.models.GPT2CausalLM(backbone=hub_backbone, preprocessor=None)
    assert _max_abs_difference(lm(inputs), hub_lm(inputs), real) <= 1e-5


def test_a_task_loaded_with_a_dtype_from_a_keras_hub_directory_gives_it_to_its_backbone(hub_presets):
    # As keras-hub's own loader does: the weights held in bfloat16, not a float32 backbone under
    # a bfloat16 task; the logits those of keras-hub's backbone loaded in bfloat16.
    hub_backbone, directory = hub_presets["gpt2"]
    lm = models.GPTCausalLM.from_preset(directory, dtype="bfloat16")
    assert {w.dtype for w in lm.backbone.weights} == {"bfloat16"}
    hub_bf16 = keras_hub.models.Backbone.from_preset(directory, dtype="bfloat16")
    inputs, real = _padded_batch()
    ours, theirs = (np.asarray(x, np.float32) for x in (lm.backbone(inputs), hub_bf16(inputs)))
    assert _max_abs_difference(ours, theirs, real) <= 0.05 * np.abs(theirs[real]).max()
    assert _max_abs_difference(ours, np.asarray(hub_backbone(inputs)), real) > 0  # rounded to bfloat16


def test_task_takes_its_arguments_with_a_keras_hub_directory(hub_presets):
    classifier = models.BertClassifier.from_preset(hub_presets["bert"][1], num_classes=4, dropout=0.0)
    assert classifier.num_classes == 4
    assert classifier.backbone.hidden_dim == HUB_CONFIG["hidden_dim"]


def test_missing_directory(tmp_path):
    with pytest.raises(ValueError, match="does not exist.*BertBackbone.save_to_preset"):
        models.BertBackbone.from_preset(str(tmp_path / "nothing_here"))


def test_directory_without_weights_lists_what_it_found(hub_presets, tmp_path):
    shutil.copy(f"{hub_presets['bert'][1]}/config.json", tmp_path)
    with pytest.raises(
        ValueError, match=r"expected 'config.json' and one of .*model.weights.h5.*found \['config.json'\]"
    ):
        models.BertBackbone.from_preset(str(tmp_path))


def test_other_architecture_is_refused(hub_presets):
    with pytest.raises(
        ValueError, match="holds a keras-hub GPT2Backbone; BertBackbone imports a keras-hub BertBackbone"
    ):
        models.BertBackbone.from_preset(hub_presets["gpt2"][1])
    with pytest.raises(ValueError, match="holds a keras-hub BertBackbone"):
        models.GPTCausalLM.from_preset(hub_presets["bert"][1])


def test_shape_mismatch_names_the_layers(hub_presets):
    with pytest.raises(
        ValueError,
        match=r"Cannot copy the keras-hub weights of .* expected shapes \[\(97, 32\)\], found \[\(97, 16\)\]",
    ):
        models.GPTBackbone.from_preset(hub_presets["gpt2"][1], hidden_dim=32)
