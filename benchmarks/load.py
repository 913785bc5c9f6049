"""Reading a GGUF file into a model: kzoo's `from_preset` against transformers' `from_pretrained(gguf_file=...)`.

For each model of `kzoo.checkpoints.fetch` that is fetched (or those named), each library loads the
file in a fresh process of its own, one after the other, `--rounds` times; the record gives the
median seconds of the load (after the library's import), the resident memory once loaded and the
peak, the float32 bytes of the weights, and kzoo's ratios. Memory is the process's, so each
library's import is in both figures.

    python -m benchmarks.load [NAME ...] [--rounds 2] [--libraries kzoo transformers] [--out record.json]
"""

import argparse
import json
import statistics
import subprocess
import sys

from benchmarks.common import report
from benchmarks.common import wait_for_quiet

# Each prints one JSON line: seconds to load, resident bytes after, peak resident bytes, parameters.
MEASURE = """
import json, resource, sys, time
path = sys.argv[1]
if sys.argv[2] == "kzoo":
    import kzoo
    start = time.perf_counter()
    model = kzoo.models.CausalLM.from_preset(path)
    seconds, parameters = time.perf_counter() - start, model.count_params()
else:
    import torch, transformers
    folder, name = path.rsplit("/", 1)
    start = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    seconds, parameters = time.perf_counter() - start, model.num_parameters()
resident = int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"seconds": seconds, "resident_bytes": resident, "peak_bytes": peak, "parameters": parameters}))
"""


LIBRARIES = ("kzoo", "transformers")


def measure(path, library):
    result = subprocess.run(
        [sys.executable, "-c", MEASURE, str(path), library], capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    from kzoo.checkpoints import fetch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="models of kzoo.checkpoints.fetch (default: every one fetched)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--libraries", nargs="+", choices=LIBRARIES, default=list(LIBRARIES), help="which to measure (default: both)"
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    names = args.names or [name for name in sorted(fetch.MODELS) if fetch.path(name)]
    results = {}
    for name in names:
        path = fetch.path(name)
        if path is None:
            sys.exit(f"{name} is not fetched: python -m kzoo.checkpoints.fetch {name}")
        runs = {library: [] for library in args.libraries}
        for _ in range(args.rounds):
            for library in runs:
                wait_for_quiet(limit_seconds=30)
                runs[library].append(measure(path, library))
        median = {
            library: {key: statistics.median(run[key] for run in values) for key in values[0]}
            for library, values in runs.items()
        }
        results[name] = {"float32_weight_bytes": 4 * next(iter(median.values()))["parameters"], **median}
        ours, theirs = median.get("kzoo"), median.get("transformers")
        if ours:
            results[name]["kzoo_peak_over_float32_weights"] = round(ours["peak_bytes"] / (4 * ours["parameters"]), 2)
        if ours and theirs:
            results[name]["kzoo_speedup"] = round(theirs["seconds"] / ours["seconds"], 2)
            results[name]["kzoo_peak_over_transformers"] = round(ours["peak_bytes"] / theirs["peak_bytes"], 2)
    report("load", {"rounds": args.rounds, "models": results}, args.out)


if __name__ == "__main__":
    main()
