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

`--model NAME` (a model of `kzoo.checkpoints.fetch`, fetched first) measures the whole model
instead: `CausalLM.from_preset(path, dtype=...)` in float32 and in bfloat16, both held in one
process (the 1.5B peaks at about 20 GB), `generate` of `--new-tokens` greedy tokens after a
32-token prompt, the two alternating for `--repeats` rounds after a warm-up call each, and the
held-out cross-entropy of each on `--held-out-rows` rows of 256 tokens of tiny Shakespeare's
validation split, with their top-1 agreement.

    python -m benchmarks.weight_dtypes --model qwen2.5-coder-0.5b-instruct [--repeats 3] [--new-tokens 64]
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


def held_out(lm, rows, reference_argmax=None):
    """`verification.Quality`'s result for `lm` on `rows` `(n, T + 1)` of ids (top-1 agreement
    with `reference_argmax` `(n, T)` where given), and its own argmax `(n, T)`."""
    import keras

    from kzoo.export import verification

    quality, picks = verification.Quality(), []
    for i, row in enumerate(rows):
        x = row[None, :-1].astype("int32")
        logits = keras.ops.convert_to_numpy(lm({"token_ids": x, "padding_mask": np.ones_like(x)}))[0]
        quality.add(logits, row[1:], reference_argmax=None if reference_argmax is None else reference_argmax[i])
        picks.append(logits.argmax(-1))
    return quality.result(), np.stack(picks)


def whole_model(name, repeats, new_tokens, held_out_rows, length=256):
    """`--model`'s record: float32 against bfloat16 weights, speed and held-out loss."""
    import kzoo
    from kzoo.checkpoints import fetch
    from kzoo.data.corpora import read_tiny_shakespeare

    path = fetch.path(name) or fetch.fetch(name)
    models = {"float32": kzoo.models.CausalLM.from_preset(path, dtype="float32")}
    text = read_tiny_shakespeare()["validation"][0]["text"]
    ids = np.asarray(models["float32"].tokenizer.tokenize(text)).reshape(-1)
    if len(ids) < held_out_rows * (length + 1):  # checked before the second model loads
        most = len(ids) // (length + 1)
        raise ValueError(f"--held-out-rows: at most {most} rows of {length} tokens; received {held_out_rows}.")
    models["bfloat16"] = kzoo.models.CausalLM.from_preset(path, dtype="bfloat16")
    prompt = [ids[:32].tolist()]
    rows = ids[: held_out_rows * (length + 1)].reshape(held_out_rows, length + 1)
    record = {"model": name, "new_tokens": new_tokens, "new_tokens_per_s": {dtype: [] for dtype in models}}
    outputs = {
        dtype: lm.generate(prompt, max_new_tokens=new_tokens, stop_token_ids=None) for dtype, lm in models.items()
    }
    for _ in range(repeats):  # the compiled calls alternate
        for dtype, lm in models.items():
            start = time.perf_counter()
            lm.generate(prompt, max_new_tokens=new_tokens, stop_token_ids=None)
            record["new_tokens_per_s"][dtype].append(round(new_tokens / (time.perf_counter() - start), 2))
    speeds = {dtype: float(np.median(v)) for dtype, v in record["new_tokens_per_s"].items()}
    record["bfloat16_over_float32"] = round(speeds["bfloat16"] / speeds["float32"], 3)
    full, full_argmax = held_out(models["float32"], rows)
    half, _ = held_out(models["bfloat16"], rows, full_argmax)
    record["held_out"] = {
        "rows": held_out_rows,
        "positions": length,
        "float32_nats": round(full["cross_entropy"], 4),
        "bfloat16_nats": round(half["cross_entropy"], 4),
        "bfloat16_minus_float32": round(half["cross_entropy"] - full["cross_entropy"], 4),
        "top1_agreement": round(half["top1_agreement"], 4),
    }
    record["same_greedy_tokens"] = outputs["float32"] == outputs["bfloat16"]
    return record


def main():
    import kzoo  # noqa: F401  (TensorFlow imported quietly)
    from kzoo import config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--columns", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--positions", default="1", help="comma-separated row counts of the activations")
    parser.add_argument("--model", default=None, help="a model of kzoo.checkpoints.fetch: the whole model instead")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--held-out-rows", type=int, default=8)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.model is not None:
        if min(args.repeats, args.new_tokens, args.held_out_rows) < 1:
            parser.error("--repeats, --new-tokens and --held-out-rows: at least 1 each")
        record = whole_model(args.model, args.repeats, args.new_tokens, args.held_out_rows)
        report("weight_dtypes", record | {"cpu_flags": cpu_flags()}, args.out)
        return
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
