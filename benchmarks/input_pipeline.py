"""Input pipeline: training fed by a recipe's tf.data pipeline against the same batches in memory.

For two recipes' pipelines, built by the recipes' own code at their default settings:
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
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The recipes are scripts that import their shared `_common` module as a sibling.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recipes"))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kzoo  # noqa: E402
import kzoo.data  # noqa: E402
from benchmarks.common import report, wait_for_quiet  # noqa: E402
from benchmarks.training import StepTimer  # noqa: E402
import _common  # noqa: E402
import bert_pretrain  # noqa: E402
import gpt_lm  # noqa: E402


def gpt_lm_case():
    args = _common.parse_args([], gpt_lm.__file__, "", gpt_lm.DEFAULTS, gpt_lm.QUICK, gpt_lm.add_arguments)
    model = gpt_lm.language_model(args)
    tokenizer = kzoo.data.character_tokenizer(model.backbone.vocabulary_size)
    windows = _common.text_windows(
        args, "train", tokenizer, args.sequence_length, args.batch_size, stride=1, shuffle=True
    )
    return args, model, windows.map(gpt_lm.gpt_inputs), int(windows.cardinality())


def bert_pretrain_case():
    args = _common.parse_args(
        ["--datasets", "kzoo_rt_polarity"], bert_pretrain.__file__, "", bert_pretrain.DEFAULTS, bert_pretrain.QUICK,
        bert_pretrain.add_arguments,
    )
    texts = bert_pretrain.corpus_texts(args)
    tokenizer = _common.word_piece_tokenizer(args, texts, lowercase=True)
    batches = kzoo.data.masked_lm_batches(
        tf.data.Dataset.from_tensor_slices(texts), tokenizer, args.sequence_length, args.batch_size,
        pack=args.pack, seed=args.seed, shuffle_buffer_size=len(texts),
    )
    backbone = kzoo.models.BertBackbone.from_preset(
        args.preset, vocabulary_size=tokenizer.vocabulary_size(), max_sequence_length=args.max_sequence_length
    )
    return args, kzoo.models.BertMaskedLM(backbone), batches, -(-len(texts) // args.batch_size)


def benchmark(case, steps, rounds, batches):
    args, model, live, steps_per_epoch = case
    _common.compile_task(model, args, steps_per_epoch, jit_compile=False)
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
        "batch_size": args.batch_size,
        "sequence_length": args.sequence_length,
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
    results = {name: benchmark(cases[name](), args.steps, args.rounds, args.batches) for name in args.recipes.split(",")}
    report("input_pipeline", {"results": results}, args.out)


if __name__ == "__main__":
    main()
