"""`export.py` and `serve_litertlm.py`, as a user runs them: their own output and nothing else.

No TensorFlow, CUDA or LiteRT log line, no retracing warning (the exporter's greedy checks
compile one decoding loop per kind of check, not one per prompt length), no softmax warning
for one-key attention. `--verbose` brings TensorFlow's lines back.
"""

import os
import subprocess
import sys
from pathlib import Path

from kzoo import data
from tests.export.tiny_models import build

REPOSITORY = Path(__file__).resolve().parents[2]


def run(script, *args):
    environment = {name: value for name, value in os.environ.items() if name != "TF_CPP_MIN_LOG_LEVEL"}
    environment["PYTHONPATH"] = str(REPOSITORY)
    command = [sys.executable, str(REPOSITORY / "export" / script), *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, env=environment, timeout=600)


def test_the_main_job_commands_print_their_own_output_only(tmp_path):
    build("gpt", vocabulary_size=128).save(tmp_path / "model.keras")
    data.save_tokenizer(data.character_tokenizer(128), tmp_path)
    # Each source of lines: TensorFlow, its greedy checks (SavedModel, text, bundles), the
    # calibrator (full integer int8), LiteRT and LiteRT-LM.
    formats = "savedmodel,tflite_int8,litertlm"
    quick = ["--num-examples", "2", "--num-representative", "2", "--latency-runs", "1", "--generate-tokens", "4"]
    exported = run(
        "export.py", tmp_path / "model.keras", "--out", tmp_path / "export", "--formats", formats, *quick,
        "--quality-bound", "tflite_int8=10",  # random weights
    )  # fmt: skip
    assert exported.returncode == 0 and exported.stderr == "", exported.stderr
    lines = exported.stdout.splitlines()
    assert [line.split()[0] for line in lines[:-1]] == [*formats.split(","), "litertlm_int8"]
    assert lines[-1] == f"Wrote {tmp_path / 'export'} (export_report.json has the details)."

    served = run("serve_litertlm.py", tmp_path / "export" / "model.litertlm", "--prompt", "RO", "--max-new-tokens", "4")
    assert served.returncode == 0 and served.stderr == "", served.stderr
    assert served.stdout.startswith("RO") and len(served.stdout) == len("RO") + 4 + 1

    verbose = run(
        "export.py",
        tmp_path / "model.keras",
        "--out",
        tmp_path / "again",
        "--formats",
        "tflite_fp32",
        "--verbose",
        *quick,
    )
    assert verbose.returncode == 0 and "Created TensorFlow Lite XNNPACK delegate for CPU" in verbose.stderr
