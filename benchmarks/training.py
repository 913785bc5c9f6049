"""Training speed: kzoo against keras-hub on identical configs, in one process.

GPT-2-style causal LM (vocab 8192, 4 layers, 4 heads, width 256, ff 1024,
batch 16 x seq 256) and BERT-style masked LM (same sizes, batch 32 x seq 128,
20 masked positions per row), each with and without XLA. Both libraries get
the same optimizer (Adam 1e-4), loss (sparse cross-entropy from logits), data
(8 cached random batches, repeated) and dropout (0.1). After a warm-up epoch
(tracing / XLA compile, not counted) each model trains one epoch of `--steps`
steps per round, alternating, for `--rounds` rounds; a step is timed from
`on_train_batch_begin` to `on_train_batch_end`.

Model FLOPs (PaLM-style, attention counted in full):
  GPT:  tokens * (6 N + 12 L d S), N = parameters without the position table.
  BERT: tokens * (6 N_body + 12 L d S) + masked * 6 N_head.
The fraction of peak divides model FLOP/s by the fp32 matmul rate measured in
this same process (`tf.matmul` 2048^3).

    python -m benchmarks.training [--steps 6] [--rounds 3] [--out training.json]
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kzoo  # noqa: E402
from benchmarks.common import median_time, report, wait_for_quiet  # noqa: E402

SIZES = dict(vocabulary_size=8192, num_layers=4, num_heads=4, hidden_dim=256, intermediate_dim=1024)


class StepTimer(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.times = []

    def on_train_batch_begin(self, batch, logs=None):
        self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter() - self.start)


def matmul_gflops(n=2048):
    a = tf.random.normal((n, n))
    matmul = tf.function(lambda x: tf.matmul(x, x))
    matmul(a).numpy()
    return 2 * n**3 / median_time(lambda: matmul(a).numpy(), 5) / 1e9


def gpt_case(rng):
    batch, length = 16, 256
    ids = rng.integers(1, SIZES["vocabulary_size"], (8, batch, length + 1)).astype("int32")
    x = {"token_ids": ids[:, :, :-1], "padding_mask": np.ones((8, batch, length), "int32")}
    data = tf.data.Dataset.from_tensor_slices((x, ids[:, :, 1:], np.ones((8, batch, length), "float32")))

    def hub():
        backbone = keras_hub.models.GPT2Backbone(**SIZES, max_sequence_length=length)
        return keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)

    def ours():
        return kzoo.models.GPTCausalLM(kzoo.models.GPTBackbone(**SIZES, max_sequence_length=length))

    def flops(model):
        n = model.backbone.count_params() - length * SIZES["hidden_dim"]  # less the position table
        return batch * length * (6 * n + 12 * SIZES["num_layers"] * SIZES["hidden_dim"] * length)

    return data.cache().repeat(), batch * length, hub, ours, flops


def bert_case(rng):
    batch, length, masked = 32, 128, 20
    ids = rng.integers(5, SIZES["vocabulary_size"], (8, batch, length)).astype("int32")
    positions = np.sort(np.stack([[rng.choice(np.arange(1, length), masked, replace=False) for _ in range(batch)] for _ in range(8)]), -1).astype("int32")
    targets = np.take_along_axis(ids, positions, -1)
    inputs = ids.copy()
    np.put_along_axis(inputs, positions, 3, -1)
    x = {
        "token_ids": inputs,
        "padding_mask": np.ones_like(inputs),
        "segment_ids": np.zeros_like(inputs),
        "mask_positions": positions,
    }
    data = tf.data.Dataset.from_tensor_slices((x, targets, np.ones_like(targets, "float32")))

    def hub():
        backbone = keras_hub.models.BertBackbone(**SIZES, max_sequence_length=length)
        return keras_hub.models.BertMaskedLM(backbone, preprocessor=None)

    def ours():
        return kzoo.models.BertMaskedLM(kzoo.models.BertBackbone(**SIZES, max_sequence_length=length))

    def flops(model):
        d, vocab = SIZES["hidden_dim"], SIZES["vocabulary_size"]
        tables = (vocab + length + 2) * d
        pooler = d * d + d
        body = model.backbone.count_params() - tables - pooler
        head = model.count_params() - model.backbone.count_params() + vocab * d
        return batch * length * (6 * body + 12 * SIZES["num_layers"] * d * length) + batch * masked * 6 * head

    return data.cache().repeat(), batch * length, hub, ours, flops


def benchmark(case, steps, rounds, jit_compile):
    data, tokens, hub, ours, flops = case
    models = {}
    for name, build in (("keras_hub", hub), ("kzoo", ours)):
        keras.utils.set_random_seed(0)
        model = build()
        model.compile(
            optimizer=keras.optimizers.Adam(1e-4),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            weighted_metrics=[],
            jit_compile=jit_compile,
        )
        start = time.perf_counter()
        model.fit(data, epochs=1, steps_per_epoch=3, verbose=0)
        models[name] = (model, StepTimer(), time.perf_counter() - start)
    wait_for_quiet()
    for _ in range(rounds):
        for model, timer, _ in models.values():
            model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[timer])
    results = {}
    for name, (model, timer, warmup) in models.items():
        step = float(np.median(timer.times))
        results[name] = {
            "median_step_s": round(step, 4),
            "tokens_per_s": round(tokens / step, 1),
            "model_gflop_per_s": round(flops(model) / step / 1e9, 1),
            "first_epoch_s": round(warmup, 1),
            "params": model.count_params(),
        }
    results["ratio_kzoo_over_keras_hub"] = round(results["kzoo"]["tokens_per_s"] / results["keras_hub"]["tokens_per_s"], 2)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default="gpt,bert")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    peak_before = matmul_gflops()
    results = {}
    for name in args.models.split(","):
        case = {"gpt": gpt_case, "bert": bert_case}[name](rng)
        for jit_compile in (False, True):
            results[f"{name}_xla_{jit_compile}"] = benchmark(case, args.steps, args.rounds, jit_compile)
    peak = max(peak_before, matmul_gflops())
    for entry in results.values():
        for name in ("keras_hub", "kzoo"):
            entry[name]["fraction_of_matmul_peak"] = round(entry[name]["model_gflop_per_s"] / peak, 3)
    report("training", {"matmul_peak_gflop_per_s": round(peak, 1), "sizes": SIZES, "results": results}, args.out)


if __name__ == "__main__":
    main()
