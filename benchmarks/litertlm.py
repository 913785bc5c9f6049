"""LiteRT-LM at GPT-2-small size: export, file sizes and speed in the runtime, against Keras and the floor.

One run, on one machine, measures for `gpt2_small` with random weights (124,439,808
parameters) and a `--cache-length` KV cache:

- the export (`export/export.py --formats litertlm`, in a child process): wall time and peak
  memory (the child's maximum resident set);
- the sizes of `model.litertlm` and `model_int8.litertlm` against the weights (float32 bytes);
- in LiteRT-LM (2 CPU threads), fp32 and int8: the decode step (the runtime's own decode
  rate), prefill tokens/s, and end-to-end new tokens/s (prefill included) for a `--prompt`
  token prompt and `--new-tokens` greedy tokens;
- kzoo's Keras `generate` at batch 1 (XLA, as its default) on the same prompt and length;
- the floor of a decode step: the time to read every weight once, at the memory bandwidth
  measured in the same run with every core (`benchmarks.common.bandwidth_meter`).

Without the GPT-2 BPE tokenizer (it comes with task models carrying Hugging Face
tokenizers), the bundle carries a character tokenizer over the 50,257 ids: prompts are
random code points, one token each.

`--trained DIR` instead measures, on the export folder of a trained model (the README's main
job: runs/gpt_lm/export), how often the int8 bundle's greedy tokens agree with the fp32
bundle's on `--prompts` held-out Tiny Shakespeare prompts.

    python -m benchmarks.litertlm [--cache-length 512] [--prompt 64] [--new-tokens 128] [--out litertlm.json]
    python -m benchmarks.litertlm --trained runs/gpt_lm/export [--prompts 20]
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kzoo  # noqa: E402
import kzoo.data  # noqa: E402
from benchmarks.common import bandwidth_meter  # noqa: E402
from benchmarks.common import report  # noqa: E402
from kzoo.export import litertlm_model  # noqa: E402

REPOSITORY = Path(__file__).resolve().parents[1]
BUNDLES = {"fp32": "model.litertlm", "int8": "model_int8.litertlm"}


def build(preset, seed=0):
    keras.utils.set_random_seed(seed)
    return kzoo.models.GPTCausalLM.from_preset(preset)


def export(lm, folder, cache_length):
    """Saves `lm` with a character tokenizer and exports it with export/export.py in a child
    process: `(export folder, report, seconds, peak resident bytes of the child)`."""
    lm.save(folder / "model.keras")
    kzoo.data.save_tokenizer(kzoo.data.CharacterTokenizer(lm.backbone.vocabulary_size), folder)
    out = folder / "export"
    command = [
        sys.executable,
        str(REPOSITORY / "export" / "export.py"),
        str(folder / "model.keras"),
        "--out",
        str(out),
        "--formats",
        "litertlm",
        "--cache-length",
        str(cache_length),
        "--max-length",
        str(cache_length),
        "--num-examples",
        "2",
        "--generate-tokens",
        "8",
        "--latency-runs",
        "1",
    ]
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode:
        raise SystemExit(f"export failed:\n{result.stderr[-3000:]}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux
    return out, json.loads((out / "export_report.json").read_text()), seconds, peak


def runtime_speed(path, prompt, new_tokens, repeats):
    """Median decode ms/token, prefill tokens/s and end-to-end new tokens/s in LiteRT-LM."""
    model = litertlm_model.LiteRTLMModel(path, num_threads=2)
    try:
        model.generate(prompt, 8, top_k=1)  # warm-up
        runs = [model.timed_generate(prompt, new_tokens, top_k=1)[1] for _ in range(repeats)]
    finally:
        model.close()
    return {
        "decode_ms_per_token": statistics.median(1000 / run["decode_tokens_per_second"] for run in runs),
        "prefill_tokens_per_second": statistics.median(run["prefill_tokens_per_second"] for run in runs),
        "end_to_end_new_tokens_per_second": statistics.median(new_tokens / run["seconds"] for run in runs),
    }


def keras_speed(lm, prompt_ids, new_tokens, repeats):
    """kzoo's `generate` at batch 1 (XLA): new tokens/s, prefill included."""
    length = len(prompt_ids) + new_tokens
    lm.generate([prompt_ids], max_length=length)  # compiles
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        lm.generate([prompt_ids], max_length=length)
        times.append(time.perf_counter() - start)
    return {"new_tokens_per_second": new_tokens / statistics.median(times)}


def scale(args):
    lm = build(args.preset)
    weights_bytes = int(sum(np.prod(w.shape) * 4 for w in lm.weights))
    rng = np.random.default_rng(0)
    # CJK ideographs where the vocabulary reaches them, else letters: one token each.
    low, high = (0x4E00, 0x4E00 + 5000) if lm.backbone.vocabulary_size > 0x4E00 + 5000 else (65, 91)
    prompt_ids = rng.integers(low, high, args.prompt).tolist()
    prompt = "".join(map(chr, prompt_ids))
    results = {
        "preset": args.preset,
        "parameters": int(lm.count_params()),
        "weights_bytes": weights_bytes,
        "cache_length": args.cache_length,
        "prompt_tokens": args.prompt,
        "new_tokens": args.new_tokens,
        "keras_generate_batch1": keras_speed(lm, prompt_ids, args.new_tokens, args.repeats),
    }
    with tempfile.TemporaryDirectory() as folder:
        out, export_report, seconds, peak = export(lm, Path(folder), args.cache_length)
        del lm
        results["export"] = {"seconds": round(seconds, 1), "peak_resident_bytes": peak}
        bandwidth = bandwidth_meter(weights_bytes)()
        results["read_bandwidth_bytes_per_second"] = bandwidth
        for precision, file_name in BUNDLES.items():
            record = export_report["artifacts"]["litertlm" if precision == "fp32" else "litertlm_int8"]
            speed = runtime_speed(out / file_name, prompt, args.new_tokens, args.repeats)
            results[precision] = {
                "file_bytes": record["size_bytes"],
                "file_over_weights": record["size_bytes"] / weights_bytes,
                "floor_ms": 1000 * record["tflite_bytes"] / bandwidth,
                "verified": {k: record[k] for k in ("max_abs_diff", "tolerance", "generation")},
                "export_seconds": record["export_seconds"],
                **speed,
            }
    fp32, int8, keras_rate = results["fp32"], results["int8"], results["keras_generate_batch1"]["new_tokens_per_second"]
    results["targets"] = {
        "fp32_step_over_weight_floor": fp32["decode_ms_per_token"] / (1000 * weights_bytes / bandwidth),
        "int8_end_to_end_over_keras": int8["end_to_end_new_tokens_per_second"] / keras_rate,
        "fp32_file_over_weights": fp32["file_over_weights"],
    }
    return results


def agreement(args):
    """int8 against fp32 greedy tokens on held-out prompts, both in LiteRT-LM."""
    text = kzoo.data.corpora.read_tiny_shakespeare()["validation"][0]["text"]
    rng = np.random.default_rng(0)
    models = {name: litertlm_model.LiteRTLMModel(Path(args.trained) / file) for name, file in BUNDLES.items()}
    try:
        room = models["fp32"].max_num_tokens - args.prompt_length
        new_tokens = min(args.new_tokens, room)
        equal = total = identical = 0
        cases = []
        for start in rng.integers(0, len(text) - args.prompt_length, args.prompts):
            prompt = text[start : start + args.prompt_length]
            texts = {name: model.generate(prompt, new_tokens, top_k=1) for name, model in models.items()}
            outputs = {name: models[name].tokenize(text) for name, text in texts.items()}
            a, b = outputs["fp32"], outputs["int8"]
            equal += sum(x == y for x, y in zip(a, b))
            total += max(len(a), len(b))
            identical += a == b
            cases.append({"prompt": prompt, "fp32": models["fp32"].detokenize(a), "int8": models["int8"].detokenize(b)})
    finally:
        for model in models.values():
            model.close()
    return {
        "export": str(args.trained),
        "prompts": args.prompts,
        "prompt_characters": args.prompt_length,
        "new_tokens": new_tokens,
        "token_agreement": equal / total,
        "identical_continuations": identical / args.prompts,
        "examples": cases[:3],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="gpt2_small")
    parser.add_argument("--cache-length", type=int, default=512)
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trained", help="an export folder with model.litertlm and model_int8.litertlm")
    parser.add_argument("--prompts", type=int, default=20, help="--trained: held-out prompts")
    parser.add_argument("--prompt-length", type=int, default=32, help="--trained: prompt characters")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.trained:
        return report("litertlm_int8_agreement", agreement(args), args.out)
    return report("litertlm", scale(args), args.out)


if __name__ == "__main__":
    main()
