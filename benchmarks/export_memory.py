"""Resident memory of `export.py`, stage by stage: where an export's peak comes from.

Runs `export/export.py`'s `main` in this process with the same arguments, a thread sampling the
process's resident memory (`VmRSS`) every 50 ms, and each stage of the export (loading, the Keras
reference, tracing, conversion, quantization, writing, the runtime checks) timed and measured on
the way in and out. Prints one row per stage, nested as the stages call each other: resident
memory at its start and end and the most sampled during it, in GB, the process's peak so far
(`VmHWM`: where it rises above the sampled peaks, the stage held a spike shorter than a sample),
and seconds; then the process's peak and the model's float32 weight bytes; `--record` writes the
rows as JSON.

    python -m benchmarks.export_memory MODEL --out-dir DIR [export.py's other arguments]
        [--record record.json]

e.g. `python -m benchmarks.export_memory smollm2_135m_instruct --out-dir runs/smollm2/export --formats
litertlm,litertlm_int4 --overwrite`.
"""

import argparse
import contextlib
import importlib
import inspect
import json
import os
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from kzoo.export.memory import resident_bytes  # noqa: E402

_GB = 1e9
# (module, attribute, stage): the functions timed as stages, patched where their callers look them up.
STAGES = (
    ("kzoo.export.exporter", "_load_model", "load the model"),
    ("kzoo.export.exporter", "_export_data", "held-out and calibration data"),
    ("kzoo.export.exporter", "KerasReference.first_logits", "Keras logits of the bundles' rows"),
    ("kzoo.export.litertlm.verification", "RuntimeSignatures", "trace the bundle's signatures"),
    ("kzoo.export.litertlm.verification", "_generation_cases", "Keras greedy generations"),
    ("kzoo.export.tflite.rerounding", "choose", "int4: which finer weights to re-round, measured"),
    ("kzoo.export.litertlm.verification", "placeholders.converted", "float32 TFLite from placeholders"),
    ("kzoo.export.tflite.placeholders", "convert", "TensorFlow's converter, placeholders"),
    ("kzoo.export.tflite.placeholders", "resolve", "the real weights' buffers"),
    ("kzoo.export.tflite.graph_passes", "Merge.add", "merge a signature's file"),
    ("kzoo.export.tflite.graph_passes", "share_subgraphs", "merge identical subgraphs"),
    ("kzoo.export.litertlm.verification", "Bundles.release_model", "let go of the Keras model"),
    ("kzoo.export.litertlm.verification", "quantize_file", "quantize"),
    ("kzoo.export.tflite.quantize", "_prepare", "rewrites before the quantizer"),
    ("kzoo.export.tflite.quantize", "_quantized", "ai-edge-quantizer"),
    ("kzoo.export.litertlm.verification", "write_bundle", "write the bundle"),
    ("ai_edge_litert.compiled_model", "CompiledModel.from_file", "LiteRT compiles the checked file"),
    ("kzoo.export.litertlm_model", "chunked_rows", "LiteRT logits a chunk at a time"),
    ("kzoo.export.litertlm_model", "decoded_rows", "LiteRT decode logits"),
    ("kzoo.export.litertlm.verification", "_shipped", "the bundle's model without the checks' signature"),
    ("kzoo.export.litertlm.verification", "_op_census", "op census"),
    ("kzoo.export.litertlm_model", "LiteRTLMModel", "LiteRT-LM loads the bundle"),
    ("kzoo.export.litertlm.verification", "_run_cases", "LiteRT-LM greedy generations"),
    ("kzoo.export.formats", "LiteRTLMBundle.build", "bundle"),
)


class Sampler:
    """A thread that keeps the largest resident memory seen since each open stage began."""

    def __init__(self, interval=0.05):
        self.interval, self.open, self.rows = interval, [], []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._lock = threading.Lock()

    def _run(self):
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self):
        rss = resident_bytes()
        with self._lock:
            for row in self.open:
                row["peak_gb"] = max(row["peak_gb"], rss / _GB)
        return rss

    @contextlib.contextmanager
    def stage(self, name, **details):
        rss = self.sample()
        row = {"stage": name, "depth": len(self.open), **details, "start_gb": rss / _GB, "peak_gb": rss / _GB}
        with self._lock:
            self.rows.append(row)
            self.open.append(row)
        start = time.perf_counter()
        try:
            yield row
        finally:
            row["seconds"] = time.perf_counter() - start
            row["end_gb"] = self.sample() / _GB
            # The process's peak so far: it rises within the stage that holds a spike shorter than a sample.
            row["hwm_gb"] = resident_bytes("VmHWM") / _GB
            with self._lock:
                self.open.remove(row)
            print(table([row], header=False), file=sys.stderr, flush=True)  # as it ends: a killed run still shows it

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def instrument(sampler):
    """Wraps each function of `STAGES` in a stage of `sampler`, where its callers look it up."""
    for module_name, attribute, name in STAGES:
        owner = importlib.import_module(module_name)
        *path, leaf = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        function = getattr(owner, leaf)

        def wrapped(*args, __function=function, __name=name, **kwargs):
            detail = {}
            if __name == "quantize":
                detail["conversion"] = args[1]
            if __name == "bundle":
                detail["format"] = args[0].name
            with sampler.stage(__name, **detail):
                return __function(*args, **kwargs)

        def wrapped_generator(*args, __function=function, __name=name, **kwargs):
            with sampler.stage(__name):  # from its first item to its last
                yield from __function(*args, **kwargs)

        setattr(owner, leaf, wrapped_generator if inspect.isgeneratorfunction(function) else wrapped)
    import tensorflow as tf

    make = tf.lite.TFLiteConverter.from_concrete_functions

    def converter(*args, **kwargs):
        made = make(*args, **kwargs)
        convert = made.convert

        def timed():
            with sampler.stage("TensorFlow's converter"):
                return convert()

        made.convert = timed
        return made

    tf.lite.TFLiteConverter.from_concrete_functions = converter


def table(rows, header=True):
    """The rows, one a line: stage, resident GB at its start, its peak and its end, seconds."""
    lines = [f"{'stage':48s} {'start':>6s} {'peak':>6s} {'end':>6s} {'VmHWM':>6s} {'s':>7s}"] if header else []
    for row in rows:
        label = "  " * row["depth"] + row["stage"] + "".join(f" {row[k]}" for k in ("format", "conversion") if k in row)
        lines.append(
            f"{label:48s} {row['start_gb']:6.2f} {row['peak_gb']:6.2f} {row['end_gb']:6.2f} {row['hwm_gb']:6.2f} "
            f"{row['seconds']:7.1f}"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], add_help=False)
    parser.add_argument("--out-dir", required=True, help="export.py's --out")
    parser.add_argument("--record", help="write the stages as JSON here")
    args, rest = parser.parse_known_args(argv)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "export"))
    import export as export_script  # export/export.py

    start = time.perf_counter()
    with Sampler() as sampler:
        instrument(sampler)
        with sampler.stage("export.py"):
            status = export_script.main([*rest, "--out", args.out_dir])
    seconds = time.perf_counter() - start
    print(table(sampler.rows))
    summary = {"status": status, "seconds": round(seconds, 1), "peak_gb": resident_bytes("VmHWM") / _GB}
    report = Path(args.out_dir) / "export_report.json"
    if report.is_file():
        parameters = json.loads(report.read_text())["model"]["parameters"]
        summary["float32_weight_gb"] = parameters * 4 / _GB
    print(json.dumps(summary))
    if args.record:
        Path(args.record).write_text(json.dumps({**summary, "stages": sampler.rows}, indent=1) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
