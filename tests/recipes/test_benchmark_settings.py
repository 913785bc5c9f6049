"""The input-pipeline benchmark builds the recipes' pipelines itself: with the recipes' default settings."""

import _common
import _language_models
import bert_pretrain

from benchmarks import input_pipeline


def test_the_benchmark_uses_the_recipes_default_settings():
    for settings, defaults in (
        (input_pipeline.GPT_LM, _language_models.DEFAULTS),
        (input_pipeline.BERT_PRETRAIN, bert_pretrain.DEFAULTS),
    ):
        shared = {key: value for key, value in settings.items() if key in defaults}
        assert shared == {key: defaults[key] for key in shared}
        assert set(settings) - set(shared) <= {"seed", "dataset"}
    assert input_pipeline.GPT_LM["dataset"] == _language_models.DEFAULTS["dataset"]
    assert input_pipeline.BERT_PRETRAIN["dataset"] in bert_pretrain.DEFAULTS["datasets"].split(",")
    assert input_pipeline.WARMUP_FRACTION == _common.WARMUP_FRACTION
    vocabulary = {key: input_pipeline.BERT_PRETRAIN[key] for key in _common.VOCABULARY_DEFAULTS}
    assert vocabulary == _common.VOCABULARY_DEFAULTS
