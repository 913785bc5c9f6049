import json
import math

import _seq2seq
import gpt_translate
import keras
import pytest

from tests.recipes.conftest import check_run_files


def test_translates_the_test_pairs_and_prints_bleu_beside_seq2seq(run_recipe, tmp_path, capsys):
    seq2seq_run = tmp_path / "seq2seq_run"
    seq2seq_run.mkdir()
    seq2seq_metrics = {"test_bleu": 12.5, "validation_loss": 2.5, "test_examples": 9, "parameters": 1000}
    seq2seq_record = {"recipe": "seq2seq_translate", "settings": {"preset": "transformer_tiny", "dataset": "kzoo_spa_eng"}}
    (seq2seq_run / "metrics.json").write_text(json.dumps({**seq2seq_record, "metrics": seq2seq_metrics}))

    # 9 test pairs in batches of 4: the last batch is filled up.
    flags = ["--evaluation-examples", "9", "--decode-batch-size", "4", "--seq2seq-run", str(seq2seq_run)]
    output_dir, record = run_recipe(gpt_translate, *flags)
    check_run_files(output_dir)  # the training loss fell
    metrics = record["metrics"]
    assert math.isfinite(metrics["test_bleu"]) and 0 <= metrics["test_bleu"] <= 100
    assert metrics["test_examples"] == 9 and metrics["seq2seq_test_bleu"] == 12.5
    assert len(metrics["examples"]) == _seq2seq.EXAMPLES_SHOWN
    assert {"source", "reference", "output"} <= set(metrics["examples"][0])
    assert keras.saving.load_model(output_dir / "model.keras", compile=False).tokenizer.vocabulary_size() > 7
    printed = capsys.readouterr().out
    assert "seq2seq_translate  transformer_tiny" in printed and "gpt_translate      gpt_tiny" in printed
    assert f"{metrics['test_bleu']:>9.2f}" in printed and "Not comparable" not in printed


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--seq2seq-run", "/nonexistent/seq2seq_run"], "--seq2seq-run /nonexistent/seq2seq_run holds no metrics.json"),
        (["--sequence-length", "2"], "--sequence-length must be >= 3"),
        (["--dataset", "kzoo_spa_fra"], "Unknown dataset 'kzoo_spa_fra'"),
    ],
)
def test_bad_input_exits_with_a_clear_message(flags, message, run_recipe, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_recipe(gpt_translate, *flags)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
