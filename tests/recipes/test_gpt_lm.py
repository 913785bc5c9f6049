import json
import math
import os
import re
import subprocess
import sys

import _language_models
import gpt_lm
import keras
import pytest

from tests.recipes.conftest import RECIPES
from tests.recipes.conftest import check_run_files

# What a recipe must not print by default: TensorFlow's C++ log lines ("I0000 00:00:1795.5  42
# port.cc:153] ...") and absl's line before them, Python warnings ("...: UserWarning: ...") and
# TensorFlow's Python notes ("WARNING:tensorflow:..." such as retracing, "WARNING:absl:...").
NOISE = re.compile(r"^[IWEF]\d{4} [\d:.]+ +\d+ \S+:\d+\]|^WARNING: All log messages|Warning: |^WARNING:", re.MULTILINE)


def run_script(command, cwd, *, verbose=False):
    """Runs `command` in a fresh Python, with no log level set: the recipe's own default."""
    environment = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.run(
        [sys.executable, *command, *(["--verbose"] if verbose else [])],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=environment,
    )


def test_main_job_runs_as_a_script_and_its_files_are_all_generate_needs(tmp_path, tfds_dir):
    """The README main job, `python recipes/gpt_lm.py --quick`, in a fresh process: its output is
    its own (no TensorFlow log line or warning), and its files are what `generate` needs."""
    output_dir = tmp_path / "run"
    command = [str(RECIPES / "gpt_lm.py"), "--quick", "--output-dir", str(output_dir), "--tfds-dir", str(tfds_dir)]
    result = run_script(command, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "validation_perplexity" in result.stdout
    assert not NOISE.findall(result.stdout + result.stderr), (result.stdout + result.stderr)[-3000:]

    check_run_files(output_dir)
    metrics = json.loads((output_dir / "metrics.json").read_text())["metrics"]
    assert metrics["validation_loss"] < math.log(256)  # Below a uniform guess over the vocabulary.
    assert metrics["validation_perplexity"] == pytest.approx(math.exp(metrics["validation_loss"]), rel=1e-4)
    assert metrics["sample"].startswith("ROMEO:")
    assert metrics["reload_max_abs_logit_difference"] == 0.0 and metrics["reload_same_sample"]
    assert (output_dir / "attention.png").stat().st_size > 0

    # The model file alone serves text: it carries its tokenizer.
    assert sorted(p.name for p in output_dir.glob("*.json")) == ["metrics.json"]
    lm = keras.saving.load_model(output_dir / "model.keras", compile=False)
    text = lm.generate("ROMEO:", max_new_tokens=5, jit_compile=False)
    token_ids = lm.generate([[ord(c) for c in "ROMEO:"]], max_new_tokens=5, jit_compile=False)[0]
    assert text == "".join(map(chr, token_ids)) and len(text) == 11


def test_verbose_brings_the_tensorflow_log_lines_back(tmp_path):
    """`--verbose` (here with `--help`, which stops after the imports) shows what TensorFlow prints."""
    quiet = run_script([str(RECIPES / "gpt_lm.py"), "--help"], tmp_path)
    verbose = run_script([str(RECIPES / "gpt_lm.py"), "--help"], tmp_path, verbose=True)
    assert quiet.returncode == verbose.returncode == 0 and "--verbose" in quiet.stdout
    assert not NOISE.findall(quiet.stdout + quiet.stderr), quiet.stderr[-3000:]
    # TensorFlow's first lines at import (oneDNN, CUDA) on this x86 CPU build.
    assert NOISE.findall(verbose.stderr), verbose.stderr[-3000:]


def test_short_is_the_main_job_setting_and_flags_still_win():
    assert (gpt_lm.parse_args([]).steps, gpt_lm.parse_args([]).epochs) == (1500, 10)
    short = gpt_lm.parse_args(["--short"])
    assert (short.steps, short.epochs, short.batch_size, short.sequence_length) == (1000, 2, 16, 128)
    assert gpt_lm.parse_args(["--short", "--steps", "7"]).steps == 7
    assert gpt_lm.parse_args(["--short", "--quick"]).steps == _language_models.QUICK["steps"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--dataset", "no_such_corpus"], "Unknown dataset 'no_such_corpus'"),
        (["--data-dir", "/nonexistent/kzoo-data"], "no such folder"),
        (["--dataset", "kzoo_wnut17"], "has no 'text' feature"),
        (["--steps", "0"], "--steps must be >= 1"),
        (["--sample-length", "100"], "--prompt plus --sample-length must fit in --sequence-length 64"),
    ],
)
def test_bad_input_exits_with_a_clear_message(flags, message, run_recipe, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_recipe(gpt_lm, *flags)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_readme_main_job_chain_ends_streaming_from_the_litertlm_bundle(tmp_path, tfds_dir):
    """The README's main job with --quick for --short: train, export (default formats), serve in LiteRT-LM."""
    repository, run = RECIPES.parent, tmp_path / "run"
    steps = [
        [str(RECIPES / "gpt_lm.py"), "--quick", "--output-dir", str(run), "--tfds-dir", str(tfds_dir)],
        [
            str(repository / "export" / "export.py"),
            str(run / "model.keras"),
            "--out",
            str(run / "export"),
            "--overwrite",
        ],
        [
            str(repository / "export" / "serve_litertlm.py"),
            str(run / "export" / "model.litertlm"),
            "--prompt",
            "ROMEO:",
            "--max-new-tokens",
            "20",
            "--greedy",
        ],
    ]
    for command in steps:
        result = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=900, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((run / "export" / "export_report.json").read_text())
    assert {"savedmodel", "tflite_fp32", "litertlm", "litertlm_int8"} <= set(report["artifacts"])
    lm = keras.saving.load_model(run / "model.keras", compile=False)
    tokenizer = lm.tokenizer
    ids = [int(i) for i in tokenizer("ROMEO:")]
    expected = tokenizer.detokenize(
        lm.generate([ids], max_length=len(ids) + 20, stop_token_ids=[0], jit_compile=False)[0]
    )
    assert result.stdout == expected + "\n"
