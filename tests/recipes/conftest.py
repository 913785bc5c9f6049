"""Runs recipes in this process (their `main(argv)`), on the shipped data, with tiny settings."""

import json
import sys
from pathlib import Path

import pytest

RECIPES = Path(__file__).parents[2] / "recipes"
# The recipes import each other and `_common` as top-level modules, as when run as scripts.
sys.path.insert(0, str(RECIPES))


@pytest.fixture(scope="session")
def tfds_dir(tmp_path_factory):
    """Prepared datasets for the whole session, so nothing is written to ~."""
    return tmp_path_factory.mktemp("tfds")


@pytest.fixture
def run_recipe(tmp_path, tfds_dir):
    """`run_recipe(module, *flags)` runs a recipe with `--quick` into a temporary folder.

    Returns:
        `(output_dir, record)`: the run's folder and its `metrics.json`, checked to exist.
    """

    def run(module, *flags):
        output_dir = tmp_path / module.__name__
        module.main(["--quick", "--output-dir", str(output_dir), "--tfds-dir", str(tfds_dir), *flags])
        return output_dir, json.loads((output_dir / "metrics.json").read_text())

    return run


def check_run_files(output_dir, model_dirs=(".",), epochs=2):
    """The files every recipe run leaves: the curves, and per model a checkpoint per epoch,
    TensorBoard logs and a history whose training loss fell; no backup once finished."""
    import _common

    assert (output_dir / "training_curves.png").stat().st_size > 0
    for name in model_dirs:
        folder = output_dir / name
        checkpoints = sorted(path.name for path in (folder / "checkpoints").iterdir())
        assert checkpoints == [f"epoch_{epoch:03d}.keras" for epoch in range(1, epochs + 1)]
        assert any((folder / "logs").rglob("events.out.tfevents.*"))
        assert not (folder / "backup").exists()
        loss = _common.read_history(folder / "history.csv")["loss"]
        assert len(loss) == epochs and loss[-1] < loss[0], loss
