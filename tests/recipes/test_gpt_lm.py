import json
import math
import subprocess
import sys

import gpt_lm
import keras
import pytest

from tests.recipes.conftest import RECIPES
from tests.recipes.conftest import check_run_files


def test_main_job_runs_as_a_script_and_its_files_are_all_generate_needs(tmp_path, tfds_dir):
    """The README main job, `python recipes/gpt_lm.py --quick`, in a fresh process."""
    output_dir = tmp_path / "run"
    command = [sys.executable, str(RECIPES / "gpt_lm.py"), "--quick", "--output-dir", str(output_dir), "--tfds-dir", str(tfds_dir)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "validation_perplexity" in result.stdout

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
    text = lm.generate("ROMEO:", max_new_tokens=5)
    token_ids = lm.generate([[ord(c) for c in "ROMEO:"]], max_new_tokens=5)[0]
    assert text == "".join(map(chr, token_ids)) and len(text) == 11


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
