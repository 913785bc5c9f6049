"""litert-torch's Hugging Face export of a checkpoint folder to `.litertlm` bundles, timed.

The peer of kzoo's LiteRT-LM export (issue 30): Google's PyTorch exporter, litert-torch
(`litert_torch.generative.export_hf`, the path it documents for Hugging Face causal LMs), on
the same weights (kzoo's `export_to_transformers` folder). Run it with the litert-torch virtual
environment's python, never kzoo's (README.md here says how to build that environment); it
imports nothing from kzoo.

Each precision is one export in its own child process, so its wall time and peak resident
memory (the child's, from `os.wait4`) are its own. The recipes are ai-edge-quantizer's, as
litert-torch names them:

- fp32: no quantization;
- int8: `dynamic_wi8_afp32` (litert-torch's default: int8 weights per channel, float
  activations quantized on the fly);
- int4: `dynamic_wi4b32_afp32` (int4 weights in blocks of 32, the scheme litert-torch #1202
  recommends);
- int4_channelwise (only when asked): `dynamic_wi4_afp32`, int4 per channel (#1068).

Bundles go to `OUT/<precision>.litertlm` (written to a temporary folder in OUT, then moved),
the exporter's output to `OUT/<precision>.log`, and the record, as JSON, to stdout and `--json`.

    /work/peers/litert_torch/bin/python benchmarks/peers/litert_torch_export.py HF_FOLDER --out DIR \
        [--precisions fp32,int8,int4] [--cache-length 2048] [--prefill-lengths 16,64,256] [--json FILE]
"""

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RECIPES = {
    "fp32": None,
    "int8": "dynamic_wi8_afp32",
    "int4": "dynamic_wi4b32_afp32",
    "int4_channelwise": "dynamic_wi4_afp32",
}


def export_command(folder, out, recipe, cache_length, prefill_lengths):
    return [
        sys.executable,
        "-m",
        "litert_torch.generative.export_hf",
        f"--model={folder}",
        f"--output_dir={out}",
        f"--cache_length={cache_length}",
        f"--prefill_lengths={','.join(map(str, prefill_lengths))}",
        f"--quantization_recipe={recipe or 'none'}",
    ]


def export(folder, out, precision, cache_length, prefill_lengths):
    """Exports one precision into `out/<precision>.litertlm`; returns its record."""
    recipe = RECIPES[precision]
    log = out / f"{precision}.log"
    with tempfile.TemporaryDirectory(dir=out) as work:
        command = export_command(folder, work, recipe, cache_length, prefill_lengths)
        load = os.getloadavg()
        start = time.perf_counter()
        with open(log, "w") as file:
            child = subprocess.Popen(command, stdout=file, stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status):
            raise SystemExit(f"litert-torch's export of {precision} failed; see {log}")
        bundle = out / f"{precision}.litertlm"
        os.replace(Path(work) / "model.litertlm", bundle)
    return {
        "path": str(bundle),
        "recipe": recipe,
        "file_bytes": bundle.stat().st_size,
        "export_seconds": round(seconds, 1),
        "export_cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
        "peak_resident_bytes": usage.ru_maxrss * 1024,  # KiB on Linux
        "load_average_before": load,
        "command": command,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="a Hugging Face folder (config.json, model.safetensors, tokenizer files)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--precisions", default="fp32,int8,int4", help=f"of {', '.join(RECIPES)}")
    parser.add_argument("--cache-length", type=int, default=2048)
    parser.add_argument("--prefill-lengths", default="16,64,256")
    parser.add_argument("--json")
    args = parser.parse_args()
    precisions = args.precisions.split(",")
    unknown = sorted(set(precisions) - set(RECIPES))
    if unknown:
        parser.error(f"--precisions: {unknown} not among {list(RECIPES)}")
    if not (Path(args.folder) / "config.json").is_file():
        parser.error(f"{args.folder} is not a Hugging Face folder: no config.json")
    prefill_lengths = [int(length) for length in args.prefill_lengths.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "peer": "litert-torch",
        "versions": {name: importlib.metadata.version(name) for name in ("litert-torch", "ai-edge-quantizer", "torch")},
        "folder": str(Path(args.folder).resolve()),
        "cache_length": args.cache_length,
        "prefill_lengths": prefill_lengths,
        "bundles": {},
    }
    for precision in precisions:
        record["bundles"][precision] = export(args.folder, out, precision, args.cache_length, prefill_lengths)
        print(json.dumps({precision: record["bundles"][precision]}), file=sys.stderr, flush=True)
    text = json.dumps(record, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
