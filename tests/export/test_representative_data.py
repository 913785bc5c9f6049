"""Calibration and held-out checks on a kzoo dataset, read with the tokenizer saved beside the model."""

import numpy as np
import pytest

from kzoo import data
from kzoo import export
from kzoo.export import export_data
from tests.export.tiny_models import build


def test_character_gpt_on_tiny_shakespeare(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    build("gpt", vocabulary_size=128).save(folder / "model.keras")
    data.save_tokenizer(data.character_tokenizer(128), folder)
    report = export.export(
        folder / "model.keras",
        tmp_path / "out",
        formats=["tflite_fp32", "tflite_int8"],
        representative_data="kzoo_tiny_shakespeare",
        data_dir=tmp_path / "tfds",
        num_examples=4,
        num_representative=8,
        latency_runs=1,
        generate_tokens=4,
    )
    assert report["data"]["source"] == "kzoo_tiny_shakespeare: calibration from 'train', held-out from 'validation'"
    assert report["data"]["targets"] == "labels"  # the next characters of the text
    int8 = report["artifacts"]["tflite_int8"]["quality"]
    assert int8["cross_entropy_increase"] <= int8["bound"]


def test_a_dataset_needs_the_model_tokenizer(tmp_path):
    build("gpt").save(tmp_path / "model.keras")
    with pytest.raises(
        export.ExportError,
        match="Representative data 'kzoo_tiny_shakespeare' needs the model's tokenizer: No tokenizer.json",
    ):
        export.export(tmp_path / "model.keras", tmp_path / "out", representative_data="kzoo_tiny_shakespeare")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model.keras"]


def test_the_default_text_is_the_datasets_rows(tmp_path):
    """`text_data` (no tensorflow-datasets) cuts the held-out rows the dataset gives."""
    tokenizer = data.character_tokenizer(128)
    names = ["padding_mask", "token_ids"]
    text = export_data.text_data(tokenizer, names, 32, 5, 3, seed=0)
    dataset = export_data.dataset_data(
        "kzoo_tiny_shakespeare", tokenizer, "causal_lm", names, 128, 32, 5, 3, data_dir=tmp_path / "tfds"
    )
    assert text.source == dataset.source
    for name in names:
        np.testing.assert_array_equal(text.held_out[name], dataset.held_out[name])
    np.testing.assert_array_equal(text.targets, dataset.targets)
    np.testing.assert_array_equal(text.held_out["token_ids"][:, 1:], text.targets[:, :-1])
    assert text.representative["token_ids"].shape == (3, 32)
    with pytest.raises(ValueError, match="holds 3 rows of 32768 tokens, fewer than the 5 held-out rows"):
        export_data.text_data(tokenizer, names, 32768, 5, 3)


def _tiny_lm_with_tokenizer(folder):
    folder.mkdir()
    build("gpt", vocabulary_size=128).save(folder / "model.keras")
    data.save_tokenizer(data.character_tokenizer(128), folder)
    return folder / "model.keras"


def test_a_causal_lm_with_a_tokenizer_is_checked_on_text_by_default(tmp_path, monkeypatch):
    model = _tiny_lm_with_tokenizer(tmp_path / "model")
    settings = {"formats": ["tflite_fp32"], "num_examples": 2, "latency_runs": 1, "generate_tokens": 2}
    report = export.export(model, tmp_path / "text", **settings)
    assert report["data"]["source"] == "kzoo_tiny_shakespeare: calibration from 'train', held-out from 'validation'"
    assert report["data"]["targets"] == "labels"
    report = export.export(model, tmp_path / "synthetic", representative_data="synthetic", **settings)
    assert report["data"]["source"].startswith("synthetic: uniform token ids")
    monkeypatch.setenv("KZOO_DATA_DIR", str(tmp_path / "no corpora"))  # kzoo installed without its corpora
    report = export.export(model, tmp_path / "fallback", **settings)
    assert report["data"]["source"].startswith("synthetic: uniform token ids")
    assert "(kzoo_tiny_shakespeare, the default text, is not installed: " in report["data"]["source"]
