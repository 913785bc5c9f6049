"""What an export runs at when given no lengths (issue 41: a real checkpoint's context of 8,192 or
32,768 positions must not become the cache and the checks unasked), and the held-out quality
measured a few rows at a time instead of over every row's logits at once."""

import math

import numpy as np
import pytest

from kzoo import data
from kzoo import export
from kzoo import models
from kzoo.export import exporter
from kzoo.export import serving_signatures
from kzoo.export import verification
from kzoo.export.export_data import synthetic_data
from kzoo.export.serving_signatures import input_names


def tiny_lm(max_sequence_length, vocabulary_size=64, hidden_dim=16):
    """A one-layer RoPE decoder: its context costs nothing until something runs that long."""
    backbone = models.DecoderBackbone(
        vocabulary_size=vocabulary_size,
        num_layers=1,
        num_heads=2,
        num_key_value_heads=1,
        hidden_dim=hidden_dim,
        intermediate_dim=2 * hidden_dim,
        max_sequence_length=max_sequence_length,
    )
    return models.CausalLM(backbone, tokenizer=data.character_tokenizer(vocabulary_size))


def test_the_cache_defaults_to_the_context_capped_at_4096():
    assert serving_signatures.DEFAULT_CACHE_LENGTH == 4096
    assert serving_signatures.check_cache_length(tiny_lm(32_768)) == 4096
    assert serving_signatures.check_cache_length(tiny_lm(100)) == 100
    assert serving_signatures.check_cache_length(tiny_lm(32_768), 8192) == 8192  # asked for: allowed to the context


@pytest.mark.parametrize("cache_length", [1, 32_769, 2.5, True, "64"])
def test_a_cache_outside_the_context_is_refused_naming_it(cache_length):
    with pytest.raises(ValueError, match=r"`cache_length` .* must be an int in \[2, 32768\]"):
        serving_signatures.check_cache_length(tiny_lm(32_768), cache_length)


@pytest.mark.parametrize(
    "context, cache, asked, checked",
    [
        (32_768, 4096, None, 256),  # a real checkpoint: DEFAULT_CHECK_LENGTH
        (32_768, 64, None, 64),  # a shorter cache
        (16, 16, None, 16),  # a shorter model
        (32_768, 4096, 1000, 1000),  # asked for
    ],
)
def test_the_checked_length_defaults_to_256_or_less(context, cache, asked, checked):
    assert exporter.DEFAULT_CHECK_LENGTH == 256
    assert exporter._check_length(asked, tiny_lm(context), cache) == checked


def test_a_checked_length_beyond_the_context_is_refused():
    with pytest.raises(export.ExportError, match=r"`max_length` \(17\) must be in \[1, 16\]"):
        exporter._check_length(17, tiny_lm(16), 16)


def test_quality_by_hand():
    # Two positions over three classes: log-sum-exp(0, ln 3, 0) = ln 5, so the cross-entropy of
    # target 1 is ln(5/3) and of target 0 is ln 5; the argmax is 1 at both.
    logits = np.log([[[1.0, 3.0, 1.0], [1.0, 3.0, 1.0]]])
    result = verification.quality(logits, np.array([[1, 0]]), reference_logits=np.log([[[1, 2, 3], [1, 3, 2]]]))
    assert result["cross_entropy"] == pytest.approx((math.log(5 / 3) + math.log(5)) / 2)
    assert result["perplexity"] == pytest.approx(math.exp(result["cross_entropy"]))
    assert result["accuracy"] == 0.5 and result["top1_agreement"] == 0.5


def test_quality_in_batches_equals_quality_at_once():
    rng = np.random.default_rng(0)
    logits, reference = rng.normal(size=(2, 10, 5, 7)) * 3
    targets, weights = rng.integers(0, 7, (10, 5)), rng.integers(0, 2, (10, 5)).astype("float32")
    measure = verification.Quality()
    for cut in (slice(0, 3), slice(3, 4), slice(4, 10)):
        measure.add(logits[cut], targets[cut], weights[cut], reference[cut].argmax(-1))
    at_once = verification.quality(logits, targets, weights, reference)
    assert measure.result() == pytest.approx(at_once, rel=1e-12)


def test_a_long_row_measured_a_few_positions_at_a_time_is_measured_whole():
    rng = np.random.default_rng(1)
    positions = 3 * verification.POSITIONS_AT_ONCE + 5  # chunks of POSITIONS_AT_ONCE and a shorter last one
    logits, reference = rng.normal(size=(2, positions, 11)) * 3
    targets, weights = rng.integers(0, 11, positions), rng.random(positions)
    reference[-1, 4] += 100.0  # the largest difference, in the last chunk
    # The formulas on the whole row at once, by hand.
    log_norm = np.log(np.exp(logits).sum(-1))
    expected = np.sum((log_norm - logits[np.arange(positions), targets]) * weights) / weights.sum()
    agreement = np.sum((logits.argmax(-1) == reference.argmax(-1)) * weights) / weights.sum()
    result = verification.quality(logits, targets, weights, reference)
    assert result["cross_entropy"] == pytest.approx(expected, rel=1e-12)
    assert result["top1_agreement"] == pytest.approx(agreement, rel=1e-12)
    assert verification.max_abs_diff(logits, reference) == np.max(np.abs(logits - reference))
    assert verification.max_abs_diff(logits[None], reference[None]) == np.max(np.abs(logits - reference))


def test_the_keras_reference_runs_a_few_rows_at_a_time(monkeypatch):
    lm = tiny_lm(32)
    names = input_names(lm)
    held_out = synthetic_data(names, 64, 32, num_examples=10, num_representative=1)
    rows_seen, call_model = [], exporter.call_model

    def counted(model, names, inputs):
        rows_seen.append(len(inputs["token_ids"]))
        return call_model(model, names, inputs)

    monkeypatch.setattr(exporter, "call_model", counted)
    reference = exporter.KerasReference(lm, names, held_out, 32)
    assert rows_seen == [] and not reference.measured  # nothing runs until asked (a bundle asks for none of it)
    targets, quality = reference.targets, reference.quality
    assert max(rows_seen) <= exporter.REFERENCE_ROWS and sum(rows_seen) == 10  # each row once
    logits = np.asarray(lm(held_out.held_out))
    np.testing.assert_array_equal(targets, logits.argmax(-1))
    assert quality == pytest.approx(verification.quality(logits, logits.argmax(-1)), rel=1e-5)
    # An artifact measured the same way: its quality over every row, agreeing with Keras everywhere.
    compared = reference.compare(lambda inputs: np.asarray(lm(inputs)))
    assert compared["quality"]["top1_agreement"] == 1.0
    assert compared["quality"]["cross_entropy"] == pytest.approx(reference.quality["cross_entropy"], rel=1e-5)
    assert list(compared["max_abs_diff"]) == ["1", "7", "32"]


@pytest.mark.e2e
def test_a_long_context_decoder_exports_its_bundles_with_no_lengths_given(tmp_path):
    """`export.py MODEL --formats litertlm,litertlm_int4` and nothing else: the bundles hold a
    4,096-slot cache and the checks run at 256 positions, not at the model's 32,768."""
    lm = tiny_lm(32_768, vocabulary_size=128, hidden_dim=64)  # the sizes of test_litertlm_int4.py
    report = export.export(lm, tmp_path / "export", formats="litertlm,litertlm_int4", num_examples=8, latency_runs=1)
    assert report["model"]["cache_length"] == 4096 and report["checked_lengths"] == [1, 7, 256]
    for name in ("litertlm", "litertlm_int8", "litertlm_int4"):
        record = report["artifacts"][name]
        assert record["max_num_tokens"] == 4096
        assert record["generation"]["token_agreement"] > 0
