import math

import lm_compare
import pytest


def test_compares_every_model_at_the_gpt_budget(run_recipe):
    # A step cap well inside the time: every model trains exactly 10 steps.
    output_dir, record = run_recipe(lm_compare, "--steps", "10", "--seconds-per-model", "60")

    metrics = record["metrics"]
    table = {row["model"]: row for row in metrics["table"]}
    assert list(table) == list(lm_compare.MODELS)
    budget = metrics["parameter_budget"]
    assert table["gpt"]["parameters"] == budget
    for name, row in table.items():
        # Within the stated tolerance of the GPT's count (3%).
        assert abs(row["parameters"] - budget) <= lm_compare.BUDGET_TOLERANCE * budget, name
        assert row["steps"] == 10, name
        assert math.isfinite(row["validation_perplexity"]), name
        assert row["validation_perplexity"] == pytest.approx(math.exp(row["validation_loss"]), rel=1e-4)
        curve = metrics["curves"][name]
        assert curve["steps"] == [1, 10], name  # after the first step, and at the end
        assert curve["validation_perplexity"][-1] == row["validation_perplexity"]
        assert curve["validation_perplexity"][-1] < curve["validation_perplexity"][0], name
    assert (output_dir / "perplexity_vs_time.png").stat().st_size > 0


def test_training_stops_when_the_time_is_up(run_recipe):
    _, record = run_recipe(lm_compare, "--models", "feed_forward", "--seconds-per-model", "0.6", "--evaluations", "2")

    (row,) = record["metrics"]["table"]
    assert 0.6 <= row["training_seconds"] < 5
    curve = record["metrics"]["curves"]["feed_forward"]
    # After the first step, at 0.3 s and when the time was up.
    assert len(curve["steps"]) == 3 and curve["training_seconds"][0] == 0.0
    assert curve["training_seconds"] == sorted(curve["training_seconds"]) and curve["steps"][-1] == row["steps"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--models", "lstm,transformer"],
            "Unknown --models ['transformer']; choose from feed_forward, rnn, lstm, gru, gpt.",
        ),
        (["--epochs", "3"], "--epochs does not apply"),
        (["--seconds-per-model", "0"], "--seconds-per-model must be > 0"),
        (["--window-size", "0"], "--window-size must be >= 1"),
        (["--models", "feed_forward", "--embedding-dim", "4096"], "No width of feed_forward comes within 3%"),
    ],
)
def test_bad_input_exits_with_a_clear_message(flags, message, run_recipe, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_recipe(lm_compare, *flags)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
