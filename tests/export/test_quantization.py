"""Quantized TFLite files: their size, and their quality loss, reported and bounded."""

import pytest

from kzoo import export
from kzoo import models
from tests.export.tiny_models import TRANSFORMER
from tests.export.tiny_models import build
from tests.export.tiny_models import redraw

# Large enough that the weights, not the graph, make up the file (as in any real model).
WEIGHTS_DOMINANT = dict(vocabulary_size=4000, hidden_dim=128, intermediate_dim=512)


def weights_dominant(family):
    """A `WEIGHTS_DOMINANT` model of `family` ("gpt" or "bert_classifier") with one transformer
    layer, which is traced, converted and quantized in about half the time of two (the token
    table is most of its weights either way)."""
    config = {**TRANSFORMER, **WEIGHTS_DOMINANT}
    if family == "gpt":
        return redraw(models.GPTCausalLM(models.GPTBackbone(num_layers=1, **config)))
    return redraw(models.BertClassifier(models.BertBackbone(num_layers=1, **config), num_classes=3, dropout=0.0))


def assert_small_and_bounded(report, quantized):
    fp32 = report["artifacts"]["tflite_fp32"]
    for name in quantized:
        artifact = report["artifacts"][name]
        assert artifact["size_bytes"] <= 0.3 * fp32["size_bytes"], name
        quality = artifact["quality"]
        assert quality["bound"] == export.QUALITY_BOUNDS[name]
        assert quality["cross_entropy_increase"] <= quality["bound"], name
        assert quality["top1_agreement"] >= 0.9, name


def test_dynamic_int8_gpt_is_small_and_close(tmp_path):
    report = export.export(
        weights_dominant("gpt"),
        tmp_path / "out",
        formats=["tflite_fp32", "tflite_int8_dynamic"],
        num_examples=4,
        latency_runs=1,
        generate_tokens=4,
    )
    assert_small_and_bounded(report, ["tflite_int8_dynamic"])
    # Quantized files generate too; their agreement with Keras is reported, not required.
    int8 = report["artifacts"]["tflite_int8_dynamic"]
    assert "decode" in int8["signatures"] and 0 <= int8["generation"]["token_agreement"] <= 1


def test_fp16_and_full_integer_int8_bert(tmp_path):
    report = export.export(
        weights_dominant("bert_classifier"),
        tmp_path / "out",
        formats=["tflite_fp32", "tflite_fp16", "tflite_int8"],
        num_examples=4,
        num_representative=8,
        latency_runs=1,
    )
    assert_small_and_bounded(report, ["tflite_int8"])
    activations = report["artifacts"]["tflite_int8"]["activation_types"]
    assert activations["INT8"] > activations.get("FLOAT32", 0)  # int8 compute, float interface only
    fp16 = report["artifacts"]["tflite_fp16"]
    assert fp16["size_bytes"] <= 0.55 * report["artifacts"]["tflite_fp32"]["size_bytes"]
    assert fp16["quality"]["cross_entropy_increase"] <= export.QUALITY_BOUNDS["tflite_fp16"]


def test_a_quality_loss_beyond_the_bound_fails_and_writes_nothing(tmp_path, monkeypatch):
    # A bound no file meets (`export` refuses a negative one it is given, before it starts). The
    # check is the format's, whatever the model: a feed-forward LM converts in a fraction of the time.
    monkeypatch.setitem(export.verification.QUALITY_BOUNDS, "tflite_int8_dynamic", -1.0)
    with pytest.raises(export.ExportError, match="tflite_int8_dynamic: the held-out cross-entropy rises"):
        export.export(
            build("feed_forward_lm"),
            tmp_path / "out",
            formats=["tflite_fp32", "tflite_int8_dynamic"],
            num_examples=2,
            latency_runs=1,
        )
    assert list(tmp_path.iterdir()) == []


def test_a_float32_difference_beyond_the_tolerance_fails_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(export.verification, "FP32_TOLERANCE", -1.0)
    with pytest.raises(
        export.ExportError, match="tflite_fp32: max \\|logit difference\\| from Keras is .* at length 1"
    ):
        export.export(
            build("feed_forward_lm"), tmp_path / "out", formats=["tflite_fp32"], num_examples=2, latency_runs=1
        )
    assert list(tmp_path.iterdir()) == []


def test_full_integer_int8_feed_forward_lm(tmp_path):
    # Unlike the recurrent models, the feed-forward LM has no WHILE loop to stop the calibrator.
    model = redraw(models.FeedForwardLanguageModel(4000, window_size=3, embedding_dim=64, hidden_dim=128))
    report = export.export(
        model,
        tmp_path / "out",
        formats=["tflite_fp32", "tflite_int8"],
        num_examples=4,
        num_representative=8,
        latency_runs=1,
    )
    int8 = report["artifacts"]["tflite_int8"]
    assert int8["size_bytes"] <= 0.3 * report["artifacts"]["tflite_fp32"]["size_bytes"]
    assert int8["quality"]["cross_entropy_increase"] <= export.QUALITY_BOUNDS["tflite_int8"]
    assert int8["activation_types"]["INT8"] > int8["activation_types"].get("FLOAT32", 0)
