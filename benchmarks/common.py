"""What every kzoo benchmark shares: quiet-machine waits, timing, and the record.

The host's speed drifts by up to +-30% between minutes (../shared/peer-baseline.md),
so benchmarks interleave kzoo and keras-hub in one process and report ratios.
"""

import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time


def cpu_busy_fraction_of_others(seconds=0.5):
    """The share of CPU time used by other processes over a short window."""

    def sample():
        with open("/proc/stat") as f:
            total = [int(v) for v in f.readline().split()[1:]]
        with open(f"/proc/{os.getpid()}/stat") as f:
            own = [int(v) for v in f.read().rsplit(")", 1)[1].split()[11:13]]
        return sum(total[:3]) + sum(total[5:8]), sum(total), sum(own)

    busy0, total0, own0 = sample()
    time.sleep(seconds)
    busy1, total1, own1 = sample()
    return max(0.0, ((busy1 - busy0) - (own1 - own0)) / max(1, total1 - total0))


def wait_for_quiet(limit_seconds=45, threshold=0.1):
    """Waits (up to a limit) until other processes use less than `threshold`."""
    start = time.time()
    while time.time() - start < limit_seconds:
        if cpu_busy_fraction_of_others() < threshold:
            return True
    return False


def median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cpu_flags():
    """The host's vector and matrix extensions (AVX2, AVX-512 ..., AMX), which decide its speed."""
    from kzoo.config import host_cpu_features

    return sorted(flag for flag in set(host_cpu_features()) if flag.startswith(("avx2", "avx512", "amx")))


def environment():
    import keras
    import keras_hub

    record = {
        "cpu": platform.processor() or platform.machine(),
        "cpu_flags": cpu_flags(),
        "cores": os.cpu_count(),
        "backend": keras.backend.backend(),
        "keras": keras.__version__,
        "keras_hub": keras_hub.__version__,
    }
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        record["tensorflow"] = tf.__version__
        record["TF_ENABLE_ONEDNN_OPTS"] = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "(default)")
    elif keras.backend.backend() == "jax":
        import jax

        record["jax"] = jax.__version__
        record["devices"] = [str(device.device_kind) for device in jax.devices()]
    return record


def greedy_runs(calls, prompts, rounds):
    """Times `calls` on every prompt and tells which gave other tokens than the model's own.

    Args:
        calls: `{name: f(prompt) -> (tokens, SpeculativeStats or None)}`, one of them "alone"
            (plain greedy generation), the others drafting.
        prompts: token-id lists; each call runs once on each to compile, then `rounds` times,
            the calls alternating.
        rounds: int.

    Returns:
        `(seconds, accepted, proposed, outputs, differ)`: per call name its total seconds and its
        drafts' accepted and proposed tokens, `outputs[(name, tuple(prompt))]` the first tokens,
        and the names whose tokens are not the "alone" call's on some prompt.
    """
    seconds, accepted, proposed = dict.fromkeys(calls, 0.0), dict.fromkeys(calls, 0), dict.fromkeys(calls, 0)
    outputs = {}
    for prompt in prompts:
        for call in calls.values():
            call(prompt)  # compiles
        for _ in range(rounds):
            for name, call in calls.items():
                start = time.perf_counter()
                tokens, stats = call(prompt)
                seconds[name] += time.perf_counter() - start
                outputs.setdefault((name, tuple(prompt)), tokens)
                if stats is not None:
                    accepted[name] += stats.accepted
                    proposed[name] += stats.proposed
    alone = {tuple(prompt): outputs[("alone", tuple(prompt))] for prompt in prompts}
    differ = [name for name in calls if any(outputs[(name, p)] != tokens for p, tokens in alone.items())]
    return seconds, accepted, proposed, outputs, differ


def in_fresh_process(function, *args):
    """`function(*args)` run in a fresh Python process (its memory is given back when it ends);
    `args` and the result pass through JSON."""
    module = function.__module__
    if module == "__main__":  # the benchmark run as `python -m benchmarks.NAME`
        module = sys.modules["__main__"].__spec__.name
    code = (
        f"import json, sys; from {module} import {function.__name__} as f; "
        "print(json.dumps(f(*json.loads(sys.argv[1]))))"
    )
    result = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"{function.__name__} failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def report(name, results, path=None):
    """Prints the results as JSON and writes them to `path` if given."""
    record = {"benchmark": name, "environment": environment(), **results}
    text = json.dumps(record, indent=2)
    print(text)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
    return record


def bandwidth_meter(num_bytes, repeats=7):
    """A function returning the bytes/s at which this process reads `num_bytes` with every core.

    The one floor meter of the benchmarks (Keras and LiteRT-LM alike): a STREAM-like read, one
    thread per core each summing its own contiguous slice of one float32 array (NumPy releases the
    GIL while it sums), the best of `repeats` reads. A decode step reads its weights with every
    core too, so a step can approach this rate but not pass it; one thread alone reads at about
    half of it on a 2-core host, which is why a single-threaded sum is not a floor. The array is
    made once, so that a benchmark can take the bandwidth beside each of its runs (it moves
    between minutes).
    """
    import numpy as np

    from kzoo.config import cpu_cores

    cores = cpu_cores()
    array = np.ones(max(cores, num_bytes // 4), "float32")
    slices = np.array_split(array, cores)

    def read_once():
        threads = [threading.Thread(target=np.sum, args=(part,)) for part in slices]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return time.perf_counter() - start

    read_once()

    def measure():
        return array.nbytes / min(read_once() for _ in range(repeats))

    return measure


def weight_floor(lm, bandwidth=None):
    """Seconds to read what one decode step of the Keras causal LM `lm` must read, and those bytes:
    every weight once, at the bandwidth every core reads (`bandwidth` in bytes/s where the caller
    has read it, else `bandwidth_meter` of the same bytes), except an untied token table, of which
    a step looks up one row (a tied table is the LM head, read whole)."""
    import numpy as np

    untied_table = None if lm.backbone.tie_embeddings else lm.backbone.embedding.token_embedding.embeddings
    read = sum(int(np.prod(w.shape)) * np.dtype(w.dtype).itemsize for w in lm.weights if w is not untied_table)
    return read / (bandwidth or bandwidth_meter(read)()), read
