"""Bad input gives a clear error and leaves nothing behind, through the API and the command line."""

import errno
import os
from pathlib import Path

import keras
import pytest
import tensorflow as tf

from kzoo import export
from kzoo.export import exporter
from kzoo.export import formats
from kzoo.export.serving_signatures import ServingSignatures
from tests.export.tiny_models import QUICK
from tests.export.tiny_models import build
from tests.export.tiny_models import load_export_command

export_command = load_export_command()


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "gpt.keras"
    build("gpt").save(path)
    return path


@pytest.fixture(scope="module")
def quick_model(tmp_path_factory):
    """The model of the tests that run a whole export to check where its files go: a feed-forward
    LM, one signature without a cache, exports in a tenth of the time of `saved_model`'s GPT (whose
    export the docstring example and tests/export/test_quantization.py check)."""
    path = tmp_path_factory.mktemp("quick_model") / "feed_forward_lm.keras"
    build("feed_forward_lm").save(path)
    return path


def leftovers(folder):
    return sorted(path.name for path in Path(folder).iterdir())


def test_missing_model_file(tmp_path, capsys):
    assert export_command.main([str(tmp_path / "nothing.keras"), "--out", str(tmp_path / "out")]) == 1
    assert "export failed: No model file at" in capsys.readouterr().err
    assert leftovers(tmp_path) == []


def test_truncated_model_file(saved_model, tmp_path):
    truncated = tmp_path / "truncated.keras"
    data = saved_model.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(export.ExportError, match="not a valid .keras file"):
        export.export(truncated, tmp_path / "out")
    assert leftovers(tmp_path) == ["truncated.keras"]


def test_not_a_keras_file(saved_model, tmp_path):
    other = tmp_path / "model.h5"
    other.write_bytes(saved_model.read_bytes())
    with pytest.raises(export.ExportError, match="is not a .keras file"):
        export.export(other, tmp_path / "out")


def test_a_keras_model_that_is_not_from_kzoo(tmp_path):
    path = tmp_path / "plain.keras"
    keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]).save(path)
    with pytest.raises(export.ExportError, match="Cannot export a Sequential: supported models are BertClassifier"):
        export.export(path, tmp_path / "out")
    assert leftovers(tmp_path) == ["plain.keras"]


def test_unknown_format(saved_model, tmp_path, capsys):
    code = export_command.main([str(saved_model), "--out", str(tmp_path / "out"), "--formats", "tflite_fp32,onnx"])
    assert code == 1
    assert "Unknown format(s) ['onnx']; choose from savedmodel, tflite_fp32" in capsys.readouterr().err
    assert leftovers(tmp_path) == []


def test_full_integer_int8_of_a_recurrent_model_is_refused(tmp_path):
    with pytest.raises(
        export.ExportError, match="tflite_int8 \\(full integer\\) is not available for RNNLanguageModel"
    ):
        export.export(build("rnn_lm"), tmp_path / "out", formats=["tflite_int8"])


def test_output_under_a_file(saved_model, tmp_path):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(export.ExportError, match="its parent .*a_file is not a folder"):
        export.export(saved_model, tmp_path / "a_file" / "out")


def test_output_in_a_folder_nobody_can_write(saved_model, capsys):
    assert export_command.main([str(saved_model), "--out", "/proc/kzoo-export"]) == 1
    assert "export failed: Cannot write into /proc" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_output_in_a_read_only_folder(saved_model, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(export.ExportError, match="Cannot write into"):
            export.export(saved_model, locked / "out")
        assert leftovers(locked) == []
    finally:
        locked.chmod(0o700)


def test_existing_output_is_kept_unless_overwrite(quick_model, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("earlier export")
    with pytest.raises(export.ExportError, match="is not an empty folder; pass --overwrite to replace it"):
        export.export(quick_model, out, formats=["tflite_fp32"])
    assert leftovers(out) == ["keep.txt"]

    export.export(quick_model, out, formats=["tflite_fp32"], overwrite=True, **QUICK)
    assert leftovers(out) == [export.REPORT_FILE, "model_fp32.tflite"]
    assert leftovers(tmp_path) == ["out"]


def test_a_corrupt_tokenizer_beside_the_model(saved_model, tmp_path):
    (saved_model.parent / "tokenizer.json").write_text('{"class_name": "UnicodeCodepoint', encoding="utf-8")
    try:
        with pytest.raises(export.ExportError, match="Cannot read the tokenizer saved beside the model"):
            export.export(saved_model, tmp_path / "out", formats=["savedmodel"])
    finally:
        (saved_model.parent / "tokenizer.json").unlink()
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("target_exists", [True, False])
def test_output_through_a_link_is_written_where_it_points(quick_model, tmp_path, target_exists, capsys):
    target, link = tmp_path / "target", tmp_path / "link"
    if target_exists:
        target.mkdir()
    link.symlink_to(target)
    command = [str(quick_model), "--out", str(link), "--formats", "tflite_fp32", "--num-examples", "2"]
    assert export_command.main([*command, "--latency-runs", "1", "--generate-tokens", "2"]) == 0
    assert f"Wrote {link}" in capsys.readouterr().out
    assert link.is_symlink() and link.resolve() == target
    assert leftovers(target) == [export.REPORT_FILE, "model_fp32.tflite"]
    assert leftovers(tmp_path) == ["link", "target"]


def test_an_output_filled_while_the_export_ran_is_not_replaced(quick_model, tmp_path, monkeypatch):
    """Another writer fills the new output folder while this export builds its files (two
    concurrent `export.py` runs to one --out): this one is refused, the other's files stay."""
    out = tmp_path / "out"
    build = formats.TFLiteFile.build

    def build_while_another_writes(self, context):
        out.mkdir()
        (out / "other.txt").write_text("the other export")
        return build(self, context)

    monkeypatch.setattr(formats.TFLiteFile, "build", build_while_another_writes)
    with pytest.raises(export.ExportError, match="was filled by another writer while this one ran; pass --overwrite"):
        export.export(quick_model, out, formats=["tflite_fp32"], **QUICK)
    assert leftovers(out) == ["other.txt"] and leftovers(tmp_path) == ["out"]


@pytest.mark.parametrize(
    "format, target, error",
    [
        ("tflite_fp32", (Path, "write_bytes"), OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))),
        # TensorFlow writes the SavedModel itself and raises its own type, with the system's message.
        (
            "savedmodel",
            (ServingSignatures, "save"),
            tf.errors.ResourceExhaustedError(None, None, "No space left on device"),
        ),
    ],
    ids=["python_write", "tensorflow_write"],
)
def test_a_full_disk_is_named_and_nothing_is_written(quick_model, tmp_path, monkeypatch, capsys, format, target, error):
    def no_space(*args, **kwargs):
        raise error

    monkeypatch.setattr(*target, no_space)
    out = tmp_path / "new" / "out"
    command = [str(quick_model), "--out", str(out), "--formats", format, "--num-examples", "2", "--latency-runs", "1"]
    assert export_command.main(command) == 1
    assert f"export failed: No space left on device: nothing was written to {out}." in capsys.readouterr().err
    assert leftovers(tmp_path) == []


def test_the_keras_reference_out_of_memory_names_the_lengths_and_writes_nothing(
    saved_model, tmp_path, monkeypatch, capsys
):
    def out_of_memory(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")

    monkeypatch.setattr(exporter, "call_model", out_of_memory)
    out = tmp_path / "out"
    assert export_command.main([str(saved_model), "--out", str(out), "--formats", "tflite_fp32"]) == 1
    message = "The Keras model ran out of memory on 4 held-out rows of length 16: pass a smaller max_length"
    assert message in capsys.readouterr().err
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("spans", [[16], [0, 8], "half", [8.5]])
def test_cache_spans_outside_the_cache_are_refused(saved_model, tmp_path, spans):
    # The tiny model's cache is its 16 positions: spans must be ints in [1, 15].
    with pytest.raises(
        export.ExportError, match=r"`cache_spans` must be \"auto\", \"none\" \(or None\) or ints in \[1, 15\]"
    ):
        export.export(saved_model, tmp_path / "out", "litertlm", cache_spans=spans, **QUICK)
    assert leftovers(tmp_path) == []


def no_export(*args, **kwargs):
    raise AssertionError("the export started: a bad quality bound must be refused before the model is loaded")


@pytest.mark.parametrize(
    "bounds, message",
    [
        ({"tflite_in8": 0.2}, "`quality_bounds` names 'tflite_in8', which has no quality bound; the quantized formats "
         "are tflite_fp16, tflite_int8_dynamic, tflite_int8, litertlm_int8, litertlm_int4."),
        ({"tflite_int8": float("nan")}, "`quality_bounds['tflite_int8']` must be a finite number of nats in [0, inf); "
         "received nan."),
        ({"tflite_fp16": -0.1}, "`quality_bounds['tflite_fp16']` must be a finite number of nats in [0, inf)"),
        ({"tflite_fp16": "0.1"}, "received '0.1'."),
    ],
    ids=["misspelt_format", "nan", "negative", "a_string"],
)  # fmt: skip
def test_a_bad_quality_bound_is_refused_before_the_export_starts(saved_model, tmp_path, monkeypatch, bounds, message):
    monkeypatch.setattr(exporter, "_load_model", no_export)
    with pytest.raises(export.ExportError) as raised:
        export.export(saved_model, tmp_path / "out", "tflite_fp32", quality_bounds=bounds)
    assert message in str(raised.value)
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "bound, message",
    [
        ("tflite_in8=0.2", "argument --quality-bound: 'tflite_in8' has no quality bound; choose from tflite_fp16, "
         "tflite_int8_dynamic, tflite_int8, litertlm_int8, litertlm_int4; received tflite_in8=0.2"),
        ("tflite_int8=nan", "argument --quality-bound: takes FORMAT=NATS, NATS a finite number >= 0, e.g. "
         "tflite_int8=0.2; received 'tflite_int8=nan'"),
        ("tflite_int8=-1", "received 'tflite_int8=-1'"),
        ("tflite_int8", "received 'tflite_int8'"),
    ],
    ids=["misspelt_format", "nan", "negative", "no_value"],
)  # fmt: skip
def test_a_bad_quality_bound_flag_is_refused_before_the_export_starts(
    saved_model, tmp_path, monkeypatch, capsys, bound, message
):
    monkeypatch.setattr(exporter, "_load_model", no_export)
    with pytest.raises(SystemExit) as raised:
        export_command.main([str(saved_model), "--out", str(tmp_path / "out"), "--quality-bound", bound])
    assert raised.value.code == 2
    assert message in capsys.readouterr().err
    assert leftovers(tmp_path) == []
