"""`model.fit` under tf.distribute and after a kill gives the weights of one uninterrupted single-device run.

Each run is a process of `train_tiny_lm.py`: logical devices must be set
before TensorFlow starts, multi-worker needs one process per worker, and a
resumed run must start from scratch.
"""

import contextlib
import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).with_name("train_tiny_lm.py")
REPOSITORY = SCRIPT.parents[2]
TIMEOUT = 120
DROPOUT = 0.1


@contextlib.contextmanager
def launcher(tmp_path):
    """`start(mode, output_dir, name, **env)` runs the script; every process is killed on exit."""
    processes = []

    def start(mode, output_dir, name, dropout=0.0, **env):
        environment = {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}
        environment.update(
            KERAS_BACKEND="tensorflow",
            TF_CPP_MIN_LOG_LEVEL="2",
            PYTHONPATH=os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])),
            **env,
        )
        log = open(tmp_path / f"{name}.log", "w")
        process = subprocess.Popen(
            [sys.executable, str(SCRIPT), mode, str(output_dir), str(tmp_path / f"{name}.npz"), str(dropout)],
            cwd=REPOSITORY,
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        process.name = name
        processes.append(process)
        return process

    try:
        yield start
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def finish(process, tmp_path):
    """Waits for `process` and returns its weights."""
    try:
        returncode = process.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        returncode = "timeout"
    log = (tmp_path / f"{process.name}.log").read_text()
    assert returncode == 0, f"{process.name} ended with {returncode}:\n{log[-3000:]}"
    weights = np.load(tmp_path / f"{process.name}.npz")
    return [weights[key] for key in weights.files]


def wait_for(path, process, tmp_path):
    deadline = time.monotonic() + TIMEOUT
    while not path.exists():
        assert process.poll() is None, (tmp_path / f"{process.name}.log").read_text()[-3000:]
        assert time.monotonic() < deadline, f"{process.name} never wrote {path.name}"
        time.sleep(0.1)


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def assert_same_weights(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a, e, rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def single_device(tmp_path_factory):
    """The reference: one uninterrupted run on one CPU, and its output directory."""
    tmp_path = tmp_path_factory.mktemp("single")
    with launcher(tmp_path) as start:
        weights = finish(start("single", tmp_path / "run", "single"), tmp_path)
    return weights, tmp_path / "run"


def test_single_device_run_writes_checkpoints_and_removes_its_backup(single_device):
    _, output_dir = single_device
    assert sorted(os.listdir(output_dir / "checkpoints")) == ["epoch_001.keras", "epoch_002.keras"]
    assert not (output_dir / "backup").exists()


def test_mirrored_over_two_logical_cpus_equals_one_device(single_device, tmp_path):
    with launcher(tmp_path) as start:
        weights = finish(start("mirrored", tmp_path / "run", "mirrored"), tmp_path)
    assert_same_weights(weights, single_device[0])


def test_two_workers_train_like_one_device_and_only_the_chief_writes(single_device, tmp_path):
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    worker_tmp = tmp_path / "worker_tmp"
    worker_tmp.mkdir()
    with launcher(tmp_path) as start:
        workers = [
            start(
                "multi_worker",
                tmp_path / "run",
                f"worker{index}",
                TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
                TMPDIR=str(worker_tmp),
            )
            for index in range(2)
        ]
        weights = [finish(worker, tmp_path) for worker in workers]
    assert_same_weights(weights[1], weights[0])
    assert_same_weights(weights[0], single_device[0])
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["epoch_001.keras", "epoch_002.keras"]
    assert not (tmp_path / "run" / "backup").exists()
    assert os.listdir(worker_tmp) == []


@pytest.fixture(scope="module")
def with_dropout(tmp_path_factory):
    """The reference of the kill tests: one uninterrupted run with dropout, and its output directory."""
    tmp_path = tmp_path_factory.mktemp("dropout")
    with launcher(tmp_path) as start:
        weights = finish(start("single", tmp_path / "run", "single", dropout=DROPOUT), tmp_path)
    return weights, tmp_path / "run"


def read_history(output_dir):
    with open(output_dir / "history.csv", newline="") as file:
        return list(csv.DictReader(file))


# 2 epochs of 6 steps, a backup every 2 steps (none at an epoch's last batch) and at
# every epoch boundary; each case kills the run at these points in turn, resuming in
# between, and then lets it finish. The first case visits every kind of point in one
# run; the others (KZOO_SLOW=1) one at a time.
KILL_POINTS = [
    pytest.param(
        ["train 3", "train 6", "validation 1 2", "train 9", "validation 2 1", "save"], id="at_every_kind_of_point"
    ),
    *[
        pytest.param(points, id=name, marks=pytest.mark.slow)
        for name, points in {
            "mid_epoch_twice": ["train 9", "train 11"],
            "after_an_epochs_last_batch": ["train 6"],
            "after_the_last_batch_of_the_run": ["train 12"],
            "just_after_an_epoch_boundary_backup": ["train 7"],
            "during_validation": ["validation 1 2"],
            "during_the_final_save": ["save"],
        }.items()
    ],
]


@pytest.mark.parametrize("points", KILL_POINTS)
def test_a_killed_run_resumes_to_the_weights_and_history_of_an_uninterrupted_one(points, with_dropout, tmp_path):
    output_dir = tmp_path / "run"
    output_dir.mkdir()
    with launcher(tmp_path) as start:
        for attempt, point in enumerate(points):
            (output_dir / "pause_at").write_text(point)
            process = start("single", output_dir, f"attempt{attempt}", dropout=DROPOUT)
            wait_for(output_dir / "paused", process, tmp_path)
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            (output_dir / "pause_at").unlink()
            (output_dir / "paused").unlink()
            assert (output_dir / "backup").exists()
        weights = finish(start("single", output_dir, "last", dropout=DROPOUT), tmp_path)
    reference_weights, reference_dir = with_dropout
    assert_same_weights(weights, reference_weights)
    history, reference = read_history(output_dir), read_history(reference_dir)
    assert [row["epoch"] for row in history] == ["0", "1"]
    for row, expected in zip(history, reference):
        assert row.keys() == expected.keys()
        for key in row:
            assert float(row[key]) == pytest.approx(float(expected[key]), rel=1e-6, abs=1e-7), key
    assert sorted(os.listdir(output_dir / "checkpoints")) == ["epoch_001.keras", "epoch_002.keras"]
    assert not (output_dir / "backup").exists()
