"""What a decode step's matrix product costs with float32 and with bfloat16 weights, under XLA and
in TensorFlow's graph mode (oneDNN), on this CPU.

One row times a weight far larger than the caches (`--rows` x `--columns`, float32 by default
537 MB), as a batch-1 decode step multiplies its activations by each weight: the time is the
time to read the weight. The record gives the best of `--repeats` calls of each product, the
read rate of the float32 weight, each product's time over XLA's float32 one, and its largest
difference from that one relative to the largest output.

`--positions 1,2,5` also multiplies 2 and 5 rows at once, as a speculative decoding's check of
k proposals multiplies k + 1 positions by every weight: read once, the weight should cost about
what one row costs. Each product's `over_one_position` is its time over its own at 1 position.

    python -m benchmarks.weight_dtypes [--rows 8192] [--columns 16384] [--repeats 7] [--positions 1] [--out record.json]
"""

import argparse
import time

import numpy as np

from benchmarks.common import cpu_flags
from benchmarks.common import report


def products(weight):
    """`{name: function of a float32 row}`: each product of the row with `weight`."""
    import tensorflow as tf

    w32 = tf.Variable(weight)
    w16 = tf.Variable(tf.cast(w32, tf.bfloat16))

    def bf16_by_bf16(x):
        return tf.cast(tf.matmul(tf.cast(x, tf.bfloat16), w16), tf.float32)

    def f32_by_widened(x):
        return tf.matmul(x, tf.cast(w16, tf.float32))

    def f32(x):
        return tf.matmul(x, w32)

    return {
        "xla_float32": tf.function(f32, jit_compile=True),
        "xla_bfloat16": tf.function(bf16_by_bf16, jit_compile=True),
        "xla_float32_by_widened_bfloat16": tf.function(f32_by_widened, jit_compile=True),
        "graph_float32": tf.function(f32),
        "graph_bfloat16": tf.function(bf16_by_bf16),
    }


def main():
    import kzoo  # noqa: F401  (TensorFlow imported quietly)
    from kzoo import config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--columns", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--positions", default="1", help="comma-separated row counts of the activations")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    positions = [int(p) for p in args.positions.split(",")]
    if 1 not in positions or min(positions) < 1:
        parser.error(f"--positions: positive row counts, 1 among them; received {args.positions!r}")
    config.add_xla_flags()  # as `generate` compiles
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(args.rows, args.columns)).astype("float32")
    functions = products(weight)
    by_positions = {}
    for count in sorted(positions):
        x = rng.normal(size=(count, args.rows)).astype("float32")
        reference = None
        results = {}
        for name, product in functions.items():
            out = product(x).numpy()  # compiled here (once per shape)
            reference = out if reference is None else reference
            seconds = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                product(x).numpy()
                seconds.append(time.perf_counter() - start)
            results[name] = {
                "ms": round(1000 * min(seconds), 2),
                "max_difference_over_largest": float(np.abs(out - reference).max() / np.abs(reference).max()),
            }
        base = results["xla_float32"]["ms"]
        for name, record in results.items():
            record["over_xla_float32"] = round(record["ms"] / base, 2)
            record["over_one_position"] = round(record["ms"] / by_positions[1][name]["ms"], 2) if count > 1 else 1.0
        by_positions[count] = results
    base = by_positions[1]["xla_float32"]["ms"]
    report(
        "weight_dtypes",
        {"weight_shape": [args.rows, args.columns], "float32_read_gb_per_s": round(weight.nbytes / base / 1e6, 1)}
        | {"cpu_flags": cpu_flags()}
        | ({"products": by_positions[1]} if positions == [1] else {"products_by_positions": by_positions}),
        args.out,
    )


if __name__ == "__main__":
    main()
