"""Calibration and held-out checks on a kzoo dataset, read with the tokenizer saved beside the model."""

import pytest

from kzoo import data
from kzoo import export
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
