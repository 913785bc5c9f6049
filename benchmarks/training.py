"""Training speed: kzoo against keras-hub on identical configs, in one process.

GPT-2-style causal LM (vocab 8192, 4 layers, 4 heads, width 256, ff 1024,
batch 16 x seq 256), BERT-style masked LM (same sizes, batch 32 x seq 128,
20 masked positions per row) and the seq2seq Transformer-tiny (kzoo's
`transformer_tiny`: vocab 1000, 2+2 post-LN layers, 4 heads, width 64, ff 256,
tied sinusoidal embeddings; batch 64 x 64 source and 64 target tokens; the
keras-hub peer is the same model built from its `TransformerEncoder`/
`TransformerDecoder`/`ReversibleEmbedding`/`SinePositionEncoding` layers, as
keras-hub has no encoder-decoder task). Each runs in float32 with and without
XLA, and in `mixed_bfloat16` without XLA where the CPU has bf16 matmul units
(XLA:CPU's dot does not use AMX, so a bf16 matmul under XLA runs at a fraction
of the rate of TensorFlow's oneDNN kernels; BENCHMARKS.md has the figures).

Both libraries get the same optimizer (Adam 1e-4), loss (sparse cross-entropy
from logits: each task model's default, `kzoo.models.TokenCrossEntropy` and
Keras' `SparseCategoricalCrossentropy`), data (8 cached random batches,
repeated) and dropout (0.1).
After a warm-up epoch (tracing / XLA compile, not counted) each model trains
one epoch of `--steps` steps per round, alternating, for `--rounds` rounds; a
step is timed from `on_train_batch_begin` to `on_train_batch_end`.

Model FLOPs (PaLM-style, attention counted in full):
  GPT:     tokens * (6 N + 12 L d S), N = parameters without the position table.
  BERT:    tokens * (6 N_body + 12 L d S) + masked * 6 N_head.
  Seq2seq: target tokens * (6 N + 12 d (L_enc S + L_dec (T + S))), S = T
           (N = all parameters: the tied table is counted once, as the logits).
The fraction of peak divides model FLOP/s by the matmul rate of the row's
precision (`tf.matmul` 2048^3, float32 or bfloat16) measured in this same
process, and the fraction of the float32 peak by the float32 rate (the speed
issue's yardstick, whatever the precision). The record says whether
TensorFlow's oneDNN kernels are on.

Under another Keras backend (`KERAS_BACKEND=jax`, on a GPU machine without
TensorFlow) the same cases run compiled (the backend's `fit` is always XLA), in
float32 and mixed_bfloat16; the batches come from a `grain` dataset,
the peak from an 8192^3 `jnp.matmul`, and `--batch-multiplier` scales every
batch for devices that the CPU-sized configs leave idle.

    python -m benchmarks.training [--steps 6] [--rounds 3] [--models gpt,bert,seq2seq] [--out training.json]
    KERAS_BACKEND=jax python -m benchmarks.training --batch-multiplier 8
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402

import kzoo  # noqa: E402
from benchmarks.common import median_time  # noqa: E402
from benchmarks.common import report  # noqa: E402
from benchmarks.common import wait_for_quiet  # noqa: E402
from kzoo.models.seq2seq.seq2seq_presets import SEQ2SEQ_PRESETS  # noqa: E402

SIZES = dict(vocabulary_size=8192, num_layers=4, num_heads=4, hidden_dim=256, intermediate_dim=1024)


class StepTimer(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.times = []

    def on_train_batch_begin(self, batch, logs=None):
        self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter() - self.start)


PRECISIONS = {"float32": "float32", "mixed_bfloat16": "bfloat16"}
TENSORFLOW = keras.backend.backend() == "tensorflow"


def matmul_gflops(dtype="float32"):
    if TENSORFLOW:
        import tensorflow as tf

        n = 2048
        a = tf.cast(tf.random.normal((n, n)), dtype)
        matmul = tf.function(lambda x: tf.matmul(x, x))
        run = lambda: matmul(a).numpy()  # noqa: E731
    else:
        n = 8192
        a = keras.ops.cast(keras.random.normal((n, n)), dtype)
        matmul = keras.ops.matmul
        if keras.backend.backend() == "jax":
            import jax

            matmul = jax.jit(matmul)
        run = lambda: keras.ops.convert_to_numpy(matmul(a, a)[0, 0])  # noqa: E731
    run()
    return 2 * n**3 / median_time(run, 5) / 1e9


def cycle(*arrays):
    """`arrays` (each `[8, batch, ...]`, or dicts of them) as 8 batches repeated: a cached
    `tf.data` pipeline under TensorFlow, a `grain` one otherwise (keras-hub's `fit` takes no
    other dataset without TensorFlow)."""
    if TENSORFLOW:
        import tensorflow as tf

        return tf.data.Dataset.from_tensor_slices(arrays).cache().repeat()
    import grain

    batches = [keras.tree.map_structure(lambda a: a[i], arrays) for i in range(len(arrays[-1]))]
    return grain.MapDataset.source(batches).repeat()


def gpt_case(rng, multiplier=1):
    batch, length = 16 * multiplier, 256
    ids = rng.integers(1, SIZES["vocabulary_size"], (8, batch, length + 1)).astype("int32")
    x = {"token_ids": ids[:, :, :-1], "padding_mask": np.ones((8, batch, length), "int32")}
    data = cycle(x, ids[:, :, 1:], np.ones((8, batch, length), "float32"))

    def hub():
        backbone = keras_hub.models.GPT2Backbone(**SIZES, max_sequence_length=length)
        return keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)

    def ours():
        return kzoo.models.GPTCausalLM(kzoo.models.GPTBackbone(**SIZES, max_sequence_length=length))

    def flops(model):
        n = model.backbone.count_params() - length * SIZES["hidden_dim"]  # less the position table
        return batch * length * (6 * n + 12 * SIZES["num_layers"] * SIZES["hidden_dim"] * length)

    return data, batch * length, hub, ours, flops


def bert_case(rng, multiplier=1):
    batch, length, masked = 32 * multiplier, 128, 20
    ids = rng.integers(5, SIZES["vocabulary_size"], (8, batch, length)).astype("int32")
    positions = np.sort(
        np.stack([[rng.choice(np.arange(1, length), masked, replace=False) for _ in range(batch)] for _ in range(8)]),
        -1,
    ).astype("int32")
    targets = np.take_along_axis(ids, positions, -1)
    inputs = ids.copy()
    np.put_along_axis(inputs, positions, 3, -1)
    x = {
        "token_ids": inputs,
        "padding_mask": np.ones_like(inputs),
        "segment_ids": np.zeros_like(inputs),
        "mask_positions": positions,
    }
    data = cycle(x, targets, np.ones_like(targets, "float32"))

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

    return data, batch * length, hub, ours, flops


def seq2seq_case(rng, multiplier=1):
    batch, length = 64 * multiplier, 64
    config = dict(SEQ2SEQ_PRESETS["transformer_tiny"]["config"])
    vocab, d = config["vocabulary_size"], config["hidden_dim"]
    source = rng.integers(1, vocab, (8, batch, length)).astype("int32")
    target = rng.integers(1, vocab, (8, batch, length + 1)).astype("int32")
    x = {"encoder_token_ids": source, "decoder_token_ids": target[:, :, :-1]}
    data = cycle(x, target[:, :, 1:], np.ones((8, batch, length), "float32"))

    def hub():
        embedding = keras_hub.layers.ReversibleEmbedding(vocab, d, name="embedding")
        positions = keras_hub.layers.SinePositionEncoding()
        dropout = keras.layers.Dropout(0.1)

        def embed(ids):
            x = embedding(ids) * d**0.5
            return dropout(x + positions(x))

        def block(layer):
            return layer(config["intermediate_dim"], config["num_heads"], dropout=0.1)

        source_ids = keras.Input((None,), dtype="int32", name="encoder_token_ids")
        target_ids = keras.Input((None,), dtype="int32", name="decoder_token_ids")
        source_mask, target_mask = keras.ops.not_equal(source_ids, 0), keras.ops.not_equal(target_ids, 0)
        h = embed(source_ids)
        for _ in range(config["num_encoder_layers"]):
            h = block(keras_hub.layers.TransformerEncoder)(h, padding_mask=source_mask)
        y = embed(target_ids)
        for _ in range(config["num_decoder_layers"]):
            y = block(keras_hub.layers.TransformerDecoder)(
                y, h, decoder_padding_mask=target_mask, encoder_padding_mask=source_mask
            )
        logits = keras.layers.Activation("linear", dtype="float32")(embedding(y, reverse=True))
        return keras.Model({"encoder_token_ids": source_ids, "decoder_token_ids": target_ids}, logits)

    def ours():
        return kzoo.models.Seq2SeqTransformer(kzoo.models.Seq2SeqBackbone(**config))

    def flops(model):
        attention = 12 * d * (config["num_encoder_layers"] * length + config["num_decoder_layers"] * 2 * length)
        return batch * length * (6 * model.count_params() + attention)

    return data, 2 * batch * length, hub, ours, flops


def benchmark(case, steps, rounds, jit_compile):
    data, tokens, hub, ours, flops = case
    models = {}
    for name, build in (("keras_hub", hub), ("kzoo", ours)):
        keras.utils.set_random_seed(0)
        model = build()
        # Each task model's own default loss (the same sparse cross-entropy
        # from logits); the peer built from layers gets Keras' loss.
        is_task = isinstance(model, (kzoo.models.Task, keras_hub.models.Task))
        model.compile(
            optimizer=keras.optimizers.Adam(1e-4),
            loss="auto" if is_task else keras.losses.SparseCategoricalCrossentropy(from_logits=True),
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
            "final_loss": round(float(model.history.history["loss"][-1]), 4),
        }
    results["ratio_kzoo_over_keras_hub"] = round(
        results["kzoo"]["tokens_per_s"] / results["keras_hub"]["tokens_per_s"], 2
    )
    return results


def onednn_enabled():
    """Whether TensorFlow's oneDNN kernels are on in this process (its runtime decision)."""
    if not TENSORFLOW:
        return False
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def bf16_matmul_units():
    """Whether the CPU advertises bf16 matmul instructions (AMX-BF16 or AVX512-BF16)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default="gpt,bert,seq2seq")
    parser.add_argument("--out", default=None)
    parser.add_argument("--batch-multiplier", type=int, default=1, help="scale every batch (for accelerators)")
    args = parser.parse_args()
    if args.batch_multiplier < 1:
        parser.error(f"--batch-multiplier must be >= 1; received {args.batch_multiplier}.")

    if not TENSORFLOW:  # the backend compiles every step; accelerators have bf16 units
        rows = [("float32", True), ("mixed_bfloat16", True)]
    else:
        rows = [("float32", False), ("float32", True)]
        if bf16_matmul_units():
            rows.append(("mixed_bfloat16", False))
    rng = np.random.default_rng(0)
    peaks = {policy: matmul_gflops(dtype) for policy, dtype in PRECISIONS.items()}
    results = {}
    for name in args.models.split(","):
        case = {"gpt": gpt_case, "bert": bert_case, "seq2seq": seq2seq_case}[name](rng, args.batch_multiplier)
        for policy, jit_compile in rows:
            keras.mixed_precision.set_global_policy(policy)
            results[f"{name}_{policy}_xla_{jit_compile}"] = entry = benchmark(
                case, args.steps, args.rounds, jit_compile
            )
            entry["precision"], entry["jit_compile"] = policy, jit_compile
    keras.mixed_precision.set_global_policy("float32")
    for policy, dtype in PRECISIONS.items():
        peaks[policy] = max(peaks[policy], matmul_gflops(dtype))
    for entry in results.values():
        for name in ("keras_hub", "kzoo"):
            gflops = entry[name]["model_gflop_per_s"]
            entry[name]["fraction_of_matmul_peak"] = round(gflops / peaks[entry["precision"]], 3)
            entry[name]["fraction_of_float32_matmul_peak"] = round(gflops / peaks["float32"], 3)
    report(
        "training",
        {
            "onednn_enabled": onednn_enabled(),
            "matmul_peak_gflop_per_s": {policy: round(peak, 1) for policy, peak in peaks.items()},
            "sizes": SIZES,
            "batch_multiplier": args.batch_multiplier,
            "results": results,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
