"""The serving examples: `serve_tflite.py` with LiteRT alone, `serve_savedmodel.py` with plain TensorFlow."""

import os
import re
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

from kzoo import export
from tests.export.tiny_models import build

REPOSITORY = Path(__file__).resolve().parents[2]

# Runs a script as `python SCRIPT ARGS` would, then says which packages it imported.
_RUN_SCRIPT = """
import os, runpy, sys
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(script))
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit as exit:
    if exit.code:
        raise
print("imported:", sorted(name for name in ("tensorflow", "keras", "kzoo") if name in sys.modules))
"""


def run_script(name, *args):
    result = subprocess.run(
        [sys.executable, "-c", _RUN_SCRIPT, str(REPOSITORY / "export" / name), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPOSITORY,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def printed(output, label):
    """The Python list printed after `label:`."""
    return eval(re.search(rf"^{label}: (\[.*\])$", output, re.MULTILINE).group(1))  # noqa: S307 (our own output)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serving")
    for family in ("gpt", "bert_classifier"):
        build(family).save(folder / f"{family}.keras")
        export.export(
            folder / f"{family}.keras",
            folder / family,
            formats=["savedmodel", "tflite_fp32"],
            num_examples=2,
            latency_runs=1,
            generate_tokens=4,
        )
    return folder


def test_serve_tflite_generates_and_classifies_without_tensorflow(exported):
    output = run_script(
        "serve_tflite.py", exported / "gpt" / "model_fp32.tflite", "--token-ids", "5,6,7", "--max-length", 12
    )
    gpt = keras.saving.load_model(exported / "gpt.keras")
    assert printed(output, "generated") == gpt.generate([[5, 6, 7]], max_length=12, jit_compile=False)[0]
    assert printed(output, "imported") == []

    output = run_script("serve_tflite.py", exported / "bert_classifier" / "model_fp32.tflite", "--token-ids", "2,8,9,3")
    classifier = keras.saving.load_model(exported / "bert_classifier.keras")
    ids = np.array([[2, 8, 9, 3]], np.int32)
    logits = classifier({"token_ids": ids, "segment_ids": 0 * ids, "padding_mask": 1 + 0 * ids})
    expected = keras.ops.convert_to_numpy(keras.ops.softmax(logits))[0]
    np.testing.assert_allclose(printed(output, "class probabilities"), expected, atol=1e-4)
    assert printed(output, "imported") == []


def test_serve_savedmodel_without_kzoo(exported):
    output = run_script(
        "serve_savedmodel.py", exported / "gpt" / "savedmodel", "--token-ids", "5,6,7", "--max-length", 12
    )
    gpt = keras.saving.load_model(exported / "gpt.keras")
    assert printed(output, "signatures") == ["generate", "serving_default"]
    assert printed(output, "generated") == gpt.generate([[5, 6, 7]], max_length=12, jit_compile=False)[0]
    assert "kzoo" not in printed(output, "imported")


def test_serve_savedmodel_takes_raw_text_when_exported_with_a_tokenizer(tmp_path):
    from kzoo import data

    model, tokenizer = build("gpt", vocabulary_size=128), data.character_tokenizer(128)
    model.save(tmp_path / "model.keras")
    data.save_tokenizer(tokenizer, tmp_path)
    export.export(tmp_path / "model.keras", tmp_path / "export", formats=["savedmodel"], num_examples=2, latency_runs=1)

    output = run_script(
        "serve_savedmodel.py", tmp_path / "export" / "savedmodel", "--text", "ROMEO:", "--max-new-tokens", 5
    )
    expected = model.generate([np.asarray(tokenizer("ROMEO:")).tolist()], max_new_tokens=5, jit_compile=False)[0]
    assert re.search(r"^generated text: (.*)$", output, re.MULTILINE).group(1) == repr(tokenizer.detokenize(expected))
    assert "kzoo" not in printed(output, "imported")
