"""Presets: the registry, `from_preset` and the published parameter counts."""

import keras
import pytest

from kzoo import models


def test_list_presets_filters_by_model():
    names = models.list_presets()
    assert names == sorted(names)
    assert models.list_presets("BertBackbone") == ["bert_base_uncased", "bert_small", "bert_tiny"]
    assert models.list_presets(models.BertClassifier) == models.list_presets("BertBackbone")
    assert models.list_presets(models.GPTCausalLM) == ["gpt2_small", "gpt_small", "gpt_tiny"]
    for name in names:
        entry = models.PRESETS[name]
        assert set(entry) - {"weights"} == {"class_name", "config", "description"}
        if "weights" in entry:  # a checkpoint that a package installs, and how to install it
            assert set(entry["weights"]) == {"package", "path", "install"}
            assert entry["weights"]["package"].replace("_", "-") in entry["weights"]["install"]


@pytest.mark.parametrize(
    "backbone_cls, task_cls, preset, count",
    [
        (models.BertBackbone, models.BertClassifier, "bert_base_uncased", 109_482_240),
        (models.GPTBackbone, models.GPTCausalLM, "gpt2_small", 124_439_808),
    ],
)
def test_published_presets_have_the_published_parameter_count(backbone_cls, task_cls, preset, count):
    # Shapes only: variables made in this scope are never initialized (no 100M random draws).
    with keras.StatelessScope(initialize_variables=False):
        backbone = backbone_cls.from_preset(preset)
        assert backbone.count_params() == count
        if task_cls is models.GPTCausalLM:  # tied output: not one parameter more
            assert task_cls(backbone).count_params() == count
    assert f"{count:,}" in models.PRESETS[preset]["description"]


@pytest.mark.parametrize("preset", ["bert_tiny", "bert_small", "gpt_tiny", "gpt_small"])
def test_small_presets_state_their_size(preset):
    entry = models.PRESETS[preset]
    with keras.StatelessScope(initialize_variables=False):
        backbone = getattr(models, entry["class_name"]).from_preset(preset)
    size = f"{backbone.count_params() / 1e6:.1f}M"
    assert size in entry["description"], (size, entry["description"])


def test_from_preset_overrides():
    backbone = models.GPTBackbone.from_preset("gpt_tiny", vocabulary_size=100, dropout=0.0)
    assert backbone.vocabulary_size == 100 and backbone.dropout == 0.0
    assert backbone.num_layers == models.PRESETS["gpt_tiny"]["config"]["num_layers"]
    classifier = models.BertClassifier.from_preset("bert_tiny", num_classes=5)
    assert classifier.num_classes == 5 and isinstance(classifier.backbone, models.BertBackbone)


def test_a_task_from_a_preset_gives_its_dtype_to_the_backbone():
    with keras.StatelessScope(initialize_variables=False):
        lm = models.GPTCausalLM.from_preset("gpt_tiny", dtype="bfloat16")
    assert {variable.dtype for variable in lm.weights} == {"bfloat16"}
    assert lm.dtype_policy.name == "bfloat16"


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ValueError, match="Unknown preset 'gpt3'.*gpt2_small.*gpt_tiny"):
        models.GPTCausalLM.from_preset("gpt3")


def test_preset_of_another_model_is_refused():
    with pytest.raises(ValueError, match="builds a BertBackbone, not a GPTBackbone"):
        models.GPTBackbone.from_preset("bert_tiny")


def test_presets_cannot_be_registered_twice():
    with pytest.raises(ValueError, match="already registered"):
        models.register_presets({"gpt_tiny": models.PRESETS["gpt_tiny"]})
