import _seq2seq
import keras
import pytest
import seq2seq_summarize
import seq2seq_translate

from tests.recipes.conftest import check_run_files


def test_translate_scores_bleu_on_test_translations(run_recipe):
    output_dir, record = run_recipe(seq2seq_translate, "--evaluation-examples", "8", "--decode-batch-size", "4")
    check_run_files(output_dir)
    metrics = record["metrics"]
    assert 0 <= metrics["test_bleu"] <= 100 and metrics["test_examples"] == 8
    assert len(metrics["examples"]) == _seq2seq.EXAMPLES_SHOWN
    assert {"source", "reference", "output"} <= set(metrics["examples"][0])
    assert keras.saving.load_model(output_dir / "model.keras", compile=False).tokenizer.vocabulary_size() > 7


@pytest.mark.slow  # the translate test runs the same seq2seq recipe code by default
def test_summarize_scores_rouge_on_dev_summaries(run_recipe):
    output_dir, record = run_recipe(seq2seq_summarize, "--evaluation-examples", "6", "--decode-batch-size", "4")
    check_run_files(output_dir)
    metrics = record["metrics"]
    for name in ("rouge1", "rouge2", "rougeL"):
        assert 0 <= metrics[f"validation_{name}"] <= 100
    assert metrics["validation_examples"] == 6


def test_rouge_matches_rouge_score():
    # Counted by hand as rouge_score (use_stemmer=False) counts: 5 of 6 reference and 8 summary
    # unigrams match, 3 of 5 and 7 bigrams, and the longest common subsequence has 5 tokens.
    reference = "The cat sat on the mat."
    summary = "the cat lay on the mat, the end"
    assert seq2seq_summarize.ROUGE["rouge1"](reference, summary) == pytest.approx(
        2 * (5 / 8) * (5 / 6) / (5 / 8 + 5 / 6)
    )
    assert seq2seq_summarize.ROUGE["rouge2"](reference, summary) == pytest.approx(
        2 * (3 / 7) * (3 / 5) / (3 / 7 + 3 / 5)
    )
    assert seq2seq_summarize.ROUGE["rougeL"](reference, summary) == pytest.approx(
        2 * (5 / 8) * (5 / 6) / (5 / 8 + 5 / 6)
    )
    assert seq2seq_summarize.ROUGE["rouge2"]("a b", "c d") == 0.0
    assert seq2seq_summarize.ROUGE["rougeL"]("", "a") == 0.0


def test_unknown_dataset_is_a_clear_error(run_recipe, capsys):
    with pytest.raises(SystemExit):
        run_recipe(seq2seq_translate, "--dataset", "kzoo_spa_fra")
    assert "Unknown dataset 'kzoo_spa_fra'" in capsys.readouterr().err
