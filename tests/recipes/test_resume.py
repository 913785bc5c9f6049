"""A recipe killed at any point resumes, when rerun with the same command, to the files of an
uninterrupted run; a second run on the same folder, or a rerun with other settings, is refused."""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import pytest

import kzoo  # noqa: F401 (registers the model classes for loading)

SCRIPT = Path(__file__).with_name("paused_recipe.py")
REPOSITORY = SCRIPT.parents[2]
TIMEOUT = 300
# gpt_lm, tiny: 2 epochs of 4 steps, 2 validation batches each.
FLAGS = [
    "--quick", "--steps", "8", "--epochs", "2", "--batch-size", "4", "--sequence-length", "16",
    "--validation-batches", "2", "--sample-length", "4", "--prompt", "RO",
]  # fmt: skip


def start(output_dir, tfds_dir, log, *flags):
    environment = dict(
        os.environ,
        KERAS_BACKEND="tensorflow",
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])),
    )
    command = [
        sys.executable,
        str(SCRIPT),
        "gpt_lm",
        *FLAGS,
        "--output-dir",
        str(output_dir),
        "--tfds-dir",
        str(tfds_dir),
    ]
    return subprocess.Popen(
        [*command, *flags], env=environment, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def finish(process, log_path):
    try:
        code = process.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        code = "timeout"
    return code, Path(log_path).read_text()


def run_to_the_end(output_dir, tfds_dir, log_path, *flags):
    with open(log_path, "w") as log:
        code, text = finish(start(output_dir, tfds_dir, log, *flags), log_path)
    assert code == 0, text[-3000:]
    return text


def kill_at(point, output_dir, tfds_dir, log_path):
    """Runs until `point`, leaves the process paused there and returns it (the caller kills it)."""
    (output_dir / "pause_at").write_text(point)
    log = open(log_path, "w")
    process = start(output_dir, tfds_dir, log)
    deadline = time.monotonic() + TIMEOUT
    while not (output_dir / "paused").exists():
        assert process.poll() is None, Path(log_path).read_text()[-3000:]
        assert time.monotonic() < deadline, f"never paused at {point}"
        time.sleep(0.2)
    return process


def stop(process, output_dir):
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    (output_dir / "pause_at").unlink()
    (output_dir / "paused").unlink()


def model_weights(output_dir):
    return keras.saving.load_model(output_dir / "model.keras", compile=False).get_weights()


def history(output_dir):
    with open(output_dir / "history.csv", newline="") as file:
        return list(csv.DictReader(file))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("uninterrupted")
    run_to_the_end(tmp_path / "run", tmp_path / "tfds", tmp_path / "log.txt")
    return tmp_path / "run", tmp_path / "tfds"


# Kill points (see paused_recipe.py): after epoch 1's last batch (the point that used to
# resume into an epoch of no step; no backup yet, the rerun starts afresh), mid-epoch 2 (from
# the backup of its start), during the last validation, and while saving the model, after
# training (from the backup of the finished training).
@pytest.mark.parametrize(
    "points",
    [
        pytest.param(["train 7", "save"], id="mid_epoch_and_while_saving"),
        pytest.param(
            ["train 4", "validation 2 2"], id="after_an_epochs_last_batch_and_in_validation", marks=pytest.mark.slow
        ),
    ],
)
def test_a_killed_recipe_reruns_to_the_files_of_an_uninterrupted_run(points, uninterrupted, tmp_path):
    reference, tfds_dir = uninterrupted
    output_dir = tmp_path / "run"
    output_dir.mkdir()
    for attempt, point in enumerate(points):
        process = kill_at(point, output_dir, tfds_dir, tmp_path / f"attempt{attempt}.txt")
        if attempt == 0:  # A second run on the folder while the first holds it.
            with open(tmp_path / "second.txt", "w") as log:
                code, text = finish(start(output_dir, tfds_dir, log), tmp_path / "second.txt")
            assert code == 2, text[-3000:]
            assert f"is in use by another run: pid {process.pid} on " in text
        stop(process, output_dir)
    if (output_dir / "backup").is_dir():  # A rerun that would mix two runs is refused, the backup kept.
        with open(tmp_path / "rerun.txt", "w") as log:
            code, text = finish(start(output_dir, tfds_dir, log, "--preset", "gpt_small"), tmp_path / "rerun.txt")
        assert code == 2, text[-3000:]
        assert "holds the backup of an unfinished run of other settings" in text
        assert "--preset gpt_tiny (now gpt_small)" in text and f"delete {output_dir / 'backup'}" in text
        assert (output_dir / "backup").is_dir()
    text = run_to_the_end(output_dir, tfds_dir, tmp_path / "last.txt")
    assert "validation_loss" in text

    for actual, expected in zip(model_weights(output_dir), model_weights(reference), strict=True):
        np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-6)
    rows, expected = history(output_dir), history(reference)
    assert [row["epoch"] for row in rows] == ["0", "1"]
    for row, other in zip(rows, expected, strict=True):
        assert {key: float(value) for key, value in row.items()} == pytest.approx(
            {key: float(value) for key, value in other.items()}, rel=1e-6
        )
    assert sorted(os.listdir(output_dir / "checkpoints")) == ["epoch_001.keras", "epoch_002.keras"]
    assert not (output_dir / "backup").exists() and not (output_dir / "unfinished_run.json").exists()


def run_recipe_script(output_dir, tfds_dir, *flags):
    """gpt_lm.py itself (the entry point a user runs), tiny, in a fresh process: `(exit status, output)`."""
    environment = dict(
        os.environ,
        KERAS_BACKEND="tensorflow",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])),
    )
    command = [sys.executable, str(REPOSITORY / "recipes" / "gpt_lm.py"), *FLAGS]
    command += ["--output-dir", str(output_dir), "--tfds-dir", str(tfds_dir), *flags]
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=TIMEOUT)
    return result.returncode, result.stdout + result.stderr


def run_files(output_dir):
    """The bytes of every file a run writes (the lock aside)."""
    return {
        str(path.relative_to(output_dir)): path.read_bytes()
        for path in sorted(output_dir.rglob("*"))
        if path.is_file() and path.name != ".lock"
    }


def test_a_finished_run_is_not_overwritten_by_a_rerun(uninterrupted, tmp_path):
    """A rerun on a finished run's folder: other settings are refused, naming them, and the same
    settings train nothing; both leave every file as it was. `--overwrite` trains afresh."""
    reference, tfds_dir = uninterrupted
    output_dir = tmp_path / "run"
    shutil.copytree(reference, output_dir)
    files = run_files(output_dir)
    assert {"model.keras", "metrics.json", "history.csv", "checkpoints/epoch_002.keras"} <= set(files)
    learning_rate = json.loads(files["metrics.json"])["settings"]["learning_rate"]

    code, text = run_recipe_script(output_dir, tfds_dir, "--learning-rate", "0.01", "--seed", "3")
    assert code == 2, text[-3000:]
    assert "holds a finished run of other settings, whose files this run would replace: --learning-rate " in text
    assert f"--learning-rate {learning_rate} (now 0.01), --seed 0 (now 3)" in text and "--overwrite" in text
    assert run_files(output_dir) == files

    code, text = run_recipe_script(output_dir, tfds_dir)
    assert code == 0, text[-3000:]
    assert "holds a finished run of these settings: nothing to train" in text and "validation_loss" in text
    assert "Epoch 1/2" not in text
    assert run_files(output_dir) == files

    code, text = run_recipe_script(output_dir, tfds_dir, "--learning-rate", "0.01", "--overwrite")
    assert code == 0, text[-3000:]
    assert json.loads((output_dir / "metrics.json").read_text())["settings"]["learning_rate"] == 0.01
    assert [row["epoch"] for row in history(output_dir)] == ["0", "1"]
    assert sorted(os.listdir(output_dir / "checkpoints")) == ["epoch_001.keras", "epoch_002.keras"]
    assert len(list((output_dir / "logs" / "train").iterdir())) == 1  # this run's TensorBoard file alone
    assert run_files(output_dir)["model.keras"] != files["model.keras"]
