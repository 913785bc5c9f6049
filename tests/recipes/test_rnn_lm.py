import json

import _language_models
import pytest
import rnn_lm

from tests.recipes.conftest import check_run_files


def test_trains_at_the_gpt_budget_and_compares_with_a_gpt_run(run_recipe, tmp_path):
    gpt_run = tmp_path / "gpt_run"
    gpt_run.mkdir()
    gpt_metrics = {"validation_loss": 1.5, "validation_perplexity": 4.48, "parameters": 445_952}
    settings = {"dataset": "kzoo_tiny_shakespeare", "sequence_length": 64}
    (gpt_run / "metrics.json").write_text(json.dumps({"metrics": gpt_metrics, "settings": settings}))

    output_dir, record = run_recipe(rnn_lm, "--cells", "gru", "--gpt-run", str(gpt_run))

    check_run_files(output_dir, model_dirs=["gru"])
    metrics = record["metrics"]
    assert metrics["gpt_validation_perplexity"] == 4.48
    assert metrics["gru_parameters"] == pytest.approx(metrics["parameter_budget"], rel=0.03)
    assert set(record["history"]) == {"gru"}


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_width_for_budget_is_the_nearest_width(cell):
    budget = 100_000

    def parameters(width):
        return _language_models.rnn_language_model(128, 32, width, cell, 0.0).count_params()

    width = _language_models.rnn_width_for_budget(budget, 128, 32, cell, 0.0)
    error = abs(parameters(width) - budget)
    step = _language_models.WIDTH_STEP
    assert error <= abs(parameters(width - step) - budget) and error <= abs(parameters(width + step) - budget)


def test_unknown_cell_is_a_clear_error(run_recipe, capsys):
    with pytest.raises(SystemExit):
        run_recipe(rnn_lm, "--cells", "lstm,transformer")
    assert "Unknown --cells ['transformer']" in capsys.readouterr().err
