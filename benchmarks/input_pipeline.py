"""Input pipeline: training fed by a recipe's tf.data pipeline against the same batches in memory.

For two recipes' pipelines, built with the kzoo calls the recipes make, at their default settings:
  - `gpt_lm.py`: character windows over Tiny Shakespeare, shuffled over every
    start position (`kzoo.data.lm_windows`), into its default `gpt_tiny` model;
  - `bert_pretrain.py`: WordPiece tokenization and keras-hub's
    `MaskedLMMaskGenerator` on the fly (`kzoo.data.masked_lm_batches`) over the
    rt-polarity texts, packed into full rows as the recipe does, into its default
    `bert_tiny` model;
one compiled model trains alternately on the live pipeline and on `--batches`
batches taken from it and held in memory (`cache()` after one pass), one epoch
of `--steps` steps each per round. A step is timed from `on_train_batch_begin`
to `on_train_batch_end`, which includes fetching the next batch. The ratio is
live / in-memory median step time; 1.0 means the pipeline costs nothing.

    python -m benchmarks.input_pipeline [--steps 10] [--rounds 3] [--out input_pipeline.json]
"""

import argparse
import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kzoo  # noqa: E402
import kzoo.data  # noqa: E402
from benchmarks.common import report  # noqa: E402
from benchmarks.common import wait_for_quiet  # noqa: E402
from benchmarks.training import StepTimer  # noqa: E402

# The recipes' default settings (recipes/_language_models.py, recipes/bert_pretrain.py and
# recipes/_common.py; tests/recipes/test_benchmark_settings.py keeps them equal).
GPT_LM = dict(
    preset="gpt_tiny",
    dataset="kzoo_tiny_shakespeare",
    batch_size=32,
    sequence_length=128,
    learning_rate=2e-3,
    steps=1500,
    epochs=10,
    seed=0,
)
BERT_PRETRAIN = dict(
    preset="bert_tiny",
    dataset="kzoo_rt_polarity",
    batch_size=64,
    sequence_length=64,
    max_sequence_length=128,
    vocabulary_size=8192,
    vocabulary_texts=30_000,
    learning_rate=1e-3,
    steps=4000,
    epochs=4,
    pack=True,
    seed=0,
)
WARMUP_FRACTION = 0.05


def compile_like_the_recipes(model, settings, steps_per_epoch):
    """`Task.compile` with the recipes' schedule: linear warmup, then cosine decay to 0 at the last step."""
    total_steps = steps_per_epoch * settings["epochs"]
    warmup_steps = math.ceil(WARMUP_FRACTION * total_steps)
    model.compile(
        learning_rate=settings["learning_rate"],
        warmup_steps=warmup_steps,
        decay_steps=total_steps - warmup_steps,
        jit_compile=False,
    )


def gpt_lm_case():
    settings = GPT_LM
    backbone = kzoo.models.GPTBackbone.from_preset(settings["preset"], max_sequence_length=settings["sequence_length"])
    model = kzoo.models.GPTCausalLM(backbone)
    tokenizer = kzoo.data.character_tokenizer(backbone.vocabulary_size)
    texts = kzoo.data.load(settings["dataset"], "train")
    token_ids = np.concatenate([np.asarray(tokenizer(row["text"] + b"\n")) for row in texts.as_numpy_iterator()])
    windows = kzoo.data.lm_windows(
        token_ids,
        settings["sequence_length"],
        settings["batch_size"],
        stride=1,
        shuffle_buffer_size=len(token_ids),
        seed=settings["seed"],
    )

    def gpt_inputs(inputs, targets):
        return {"token_ids": inputs, "padding_mask": tf.ones_like(inputs)}, targets

    steps_per_epoch = math.ceil(settings["steps"] / settings["epochs"])
    return settings, model, windows.map(gpt_inputs), steps_per_epoch


def bert_pretrain_case():
    settings = BERT_PRETRAIN
    rows = kzoo.data.load(settings["dataset"], "train").as_numpy_iterator()
    texts = [row["text"].decode("utf-8") for row in rows]
    sample = texts
    if len(texts) > settings["vocabulary_texts"]:
        sample = kzoo.data.seeded_split(texts, {"sample": 1.0}, settings["seed"])["sample"]
        sample = sample[: settings["vocabulary_texts"]]
    vocabulary = kzoo.data.train_word_piece_vocabulary(sample, settings["vocabulary_size"], lowercase=True)
    tokenizer = kzoo.data.word_piece_tokenizer(vocabulary, lowercase=True)
    batches = kzoo.data.masked_lm_batches(
        tf.data.Dataset.from_tensor_slices(texts),
        tokenizer,
        settings["sequence_length"],
        settings["batch_size"],
        pack=settings["pack"],
        seed=settings["seed"],
        shuffle_buffer_size=len(texts),
    )
    backbone = kzoo.models.BertBackbone.from_preset(
        settings["preset"],
        vocabulary_size=tokenizer.vocabulary_size(),
        max_sequence_length=settings["max_sequence_length"],
    )
    steps_per_epoch = math.ceil(settings["steps"] / settings["epochs"])
    return settings, kzoo.models.BertMaskedLM(backbone), batches, steps_per_epoch


def benchmark(case, steps, rounds, batches):
    settings, model, live, steps_per_epoch = case
    compile_like_the_recipes(model, settings, steps_per_epoch)
    in_memory = live.take(batches).cache().repeat()
    live = live.repeat().prefetch(tf.data.AUTOTUNE)
    model.fit(in_memory, epochs=1, steps_per_epoch=batches, verbose=0)  # fills the cache, traces
    model.fit(live, epochs=1, steps_per_epoch=3, verbose=0)
    timers = {"live": StepTimer(), "in_memory": StepTimer()}
    wait_for_quiet()
    for _ in range(rounds):
        for name, data in (("live", live), ("in_memory", in_memory)):
            model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[timers[name]])
    medians = {name: float(np.median(timer.times)) for name, timer in timers.items()}
    return {
        "batch_size": settings["batch_size"],
        "sequence_length": settings["sequence_length"],
        "median_step_s": {name: round(value, 4) for name, value in medians.items()},
        "ratio_live_over_in_memory": round(medians["live"] / medians["in_memory"], 3),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=16, help="batches held in memory")
    parser.add_argument("--recipes", default="gpt_lm,bert_pretrain")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    cases = {"gpt_lm": gpt_lm_case, "bert_pretrain": bert_pretrain_case}
    results = {
        name: benchmark(cases[name](), args.steps, args.rounds, args.batches) for name in args.recipes.split(",")
    }
    report("input_pipeline", {"results": results}, args.out)


if __name__ == "__main__":
    main()
