"""A new decoder family is one record in `kzoo.checkpoints.families`: every reader, writer and
test suite takes its families from there, so adding a record adds the family everywhere."""

import pytest
import transformers

from kzoo.checkpoints import families
from kzoo.checkpoints import tensor_maps
from kzoo.checkpoints.families import FAMILIES
from kzoo.checkpoints.gguf import layout as gguf_layout
from kzoo.checkpoints.gguf import tokenizer as gguf_tokenizer


def parameters(module, test):
    """The ids a parametrized test of `module` runs with (its `name` / `family` / `model_type`)."""
    marks = [mark for mark in getattr(module, test).pytestmark if mark.name == "parametrize"]
    (values,) = [mark.args[1] for mark in marks if mark.args[0] in ("name", "family", "model_type")]
    return sorted(value.values[0] if isinstance(value, type(pytest.param(0))) else value for value in values)


def test_every_suite_runs_every_family():
    from tests.checkpoints import test_gguf
    from tests.export import test_families as test_export_families
    from tests.export import test_litertlm_families
    from tests.models import test_causal_lm
    from tests.models import test_decoder_hf

    every = sorted(FAMILIES)
    written = sorted(families.text_families())
    # The shared causal-LM suite: every family (and GPT-2), its LoRA case included.
    assert parameters(test_causal_lm, "test_cached_steps_match_the_full_pass") == sorted([*every, "gpt2"])
    assert parameters(test_causal_lm, "test_lora_trains_its_weights_only_and_int8_stays_close") == sorted(
        [*every, "gpt2"]
    )
    # The Hugging Face round trips and the LiteRT-LM bundles: every family kzoo writes.
    assert sorted(set(parameters(test_decoder_hf, "test_logits_match_transformers")) & set(every)) == written
    assert parameters(test_litertlm_families, "test_the_bundle_gives_the_greedy_text_of_keras_and_transformers") == (
        sorted([*written, "gpt2"])
    )
    # The SavedModel and TFLite files: kzoo's other models and every family.
    exported = parameters(test_export_families, "test_savedmodel_and_tflite_match_keras")
    assert sorted(set(exported) & set(every)) == every
    # The GGUF round trips: every family with a GGUF layout.
    assert parameters(test_gguf, "test_written_files_hold_the_original_model") == sorted(families.written_as_gguf())


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_a_record_names_what_transformers_and_kzoo_know(model_type):
    family = FAMILIES[model_type]
    assert family.model_type == model_type
    assert hasattr(transformers, family.tiny.config) and hasattr(transformers, family.causal_lm)
    assert tensor_maps.FAMILIES[model_type].heads["CausalLM"].architectures == (family.causal_lm,)
    assert family.text_family is None or FAMILIES[family.text_family].text_family is None
    # A family written as GGUF has a tiny config for the round trips, and reads back as a family.
    assert (family.gguf is None) == (family.tiny.gguf is None)
    if family.gguf is not None:
        read_as = family.gguf.reads_back_as or model_type
        assert families.by_gguf_architecture(family.gguf_architecture) is FAMILIES[read_as]


def test_the_readers_take_their_tables_from_the_records():
    assert gguf_layout.SUPPORTED_ARCHITECTURES == ("llama", "qwen2", "qwen3", "gemma3")
    assert gguf_tokenizer.GEMMA_ARCHITECTURES == ("gemma", "gemma2", "gemma3")
    assert families.by_gguf_architecture("mistral") is None and families.by_gguf_architecture("phi3") is None
