"""English-to-Spanish translation with a GPT: a decoder-only conditional language model, scored with BLEU.

    python recipes/gpt_translate.py           # gpt_tiny on the spa-eng pairs
    python recipes/gpt_translate.py --quick   # a smoke run

Each `(english, spanish)` pair is one sequence `english [SEP] spanish [EOS]`
(`kzoo.data.conditional_lm_batches`), and `kzoo.models.GPTCausalLM` learns it as a language
model whose loss counts only the Spanish tokens and the final `[EOS]`: the English side is
read, never predicted. There is no encoder; the Spanish tokens attend to the English ones
through the same causal self-attention. To translate, the model continues `english [SEP]`
greedily until `[EOS]` (`generate`, ragged prompts in one batch).

Everything else is `seq2seq_translate.py`'s, so the two BLEU figures compare the architectures:
the `train` pairs of `kzoo_spa_eng` (the builder's seeded 80/10/10 split), the same shared
cased WordPiece vocabulary fitted with the same flags and seed, validation on `validation`
after each epoch, corpus BLEU on the `test` pairs with the same scorer. The validation loss
is the cross-entropy of the same target tokens (`spanish [EOS]`) in both recipes. With a
finished `seq2seq_translate` run in `--seq2seq-run` (default: `runs/seq2seq_translate`, when
it exists), the two test BLEU figures are printed side by side and its figure is recorded in
`metrics.json`.

`--sequence-length` bounds the whole sequence `english [SEP] spanish [EOS]` and is the
model's number of positions; longer pairs are cut as `conditional_lm_batches` documents (at
the default, 64, that is about 0.2% of the training pairs). To use the model later:

    lm = keras.saving.load_model("runs/gpt_translate/model.keras", compile=False)  # after `import kzoo`
    tokenizer = lm.tokenizer  # the model carries it
    prompts = kzoo.data.conditional_lm_prompts(["I like cats."], tokenizer, 64)
    ids = lm.generate(prompts, stop_token_ids=[kzoo.tokenizers.word_piece.EOS_ID])
    print(tokenizer.detokenize(ids[0][len(prompts[0]) : -1]))  # without the prompt and [EOS]

On device, in Google's LiteRT-LM runtime: export the model as a `.litertlm` bundle (its
tokenizer, a WordPiece `tokenizer.json`, keeps "[SEP]" whole and stops at [EOS]), then write
the prompt as text, `english [SEP]`:

    python export/export.py runs/gpt_translate/model.keras --out runs/gpt_translate/export --formats litertlm
    python export/serve_litertlm.py runs/gpt_translate/export/model.litertlm --prompt "How are you? [SEP]" --greedy
"""

from pathlib import Path

import _common
import _seq2seq

import kzoo
import kzoo.data
from kzoo.tokenizers.word_piece import EOS_ID

DEFAULTS = dict(
    _seq2seq.DEFAULTS,
    preset="gpt_tiny",
    # 1.6 passes over the 95,172 training pairs: a default recipe run's budget of steps.
    steps=2400,
    epochs=3,
    learning_rate=2e-3,
    sequence_length=64,
    bucket_boundaries="16,20,24,32,48",
    dropout=0.0,
)
QUICK = dict(_seq2seq.QUICK, sequence_length=48)
# Where `seq2seq_translate.py` leaves its run with its default flags.
SEQ2SEQ_RUN = Path("runs", "seq2seq_translate")


def add_arguments(parser):
    _seq2seq.add_arguments(
        parser, sequence_length_help="the most tokens of `english [SEP] spanish [EOS]`: the model's positions"
    )
    parser.add_argument("--dropout", type=float, help="the model's dropout")
    parser.add_argument(
        "--seq2seq-run",
        help=f"the folder of a finished seq2seq_translate run whose test BLEU to print beside this one "
        f"(default: {SEQ2SEQ_RUN}, when it exists)",
    )


def main(argv=None):
    args = _common.parse_args(argv, __file__, __doc__, DEFAULTS, QUICK, add_arguments)
    if args.sequence_length < 3:
        args.parser.error(
            f"--sequence-length must be >= 3 ([SEP], [EOS] and a token); received {args.sequence_length}."
        )
    seq2seq_record = read_seq2seq_run(args)
    run = _common.start(args)
    splits = _seq2seq.load_pairs(args)
    train, sources, targets = _seq2seq.training_texts(args, splits["train"])
    tokenizer = _common.word_piece_tokenizer(args, sources + targets, lowercase=False)

    def batches(pairs, **kwargs):
        return kzoo.data.conditional_lm_batches(pairs, tokenizer, args.sequence_length, args.batch_size, **kwargs)

    boundaries = _common.bucket_boundaries(args) or []
    train_batches = batches(
        train,
        bucket_boundaries=[length for length in boundaries if length < args.sequence_length - 1] or None,
        shuffle_buffer_size=len(sources),
        seed=args.seed,
    ).repeat()
    # Fixed shapes: one trace, and a known length (Keras warns on each pass of a dataset without one).
    validation_batches = batches(splits["validation"])
    if args.validation_batches:
        validation_batches = validation_batches.take(args.validation_batches)
    steps_per_epoch = _common.steps_per_epoch(args, -(-len(sources) // args.batch_size))
    with run.scope():
        backbone = kzoo.models.GPTBackbone.from_preset(
            args.preset,
            vocabulary_size=tokenizer.vocabulary_size(),
            max_sequence_length=args.sequence_length,
            dropout=args.dropout,
        )
        lm = kzoo.models.GPTCausalLM(backbone, tokenizer=tokenizer)
        _common.compile_task(lm, args, steps_per_epoch, run.jit_compile)
    history = run.fit(lm, train_batches, steps_per_epoch, validation_batches)
    run.save(lm)

    test_sources, references = _seq2seq.test_pairs(splits["test"], args.evaluation_examples)
    hypotheses = translate(lm, tokenizer, test_sources, args.sequence_length, args.decode_batch_size)
    examples = _seq2seq.show_examples(test_sources, references, hypotheses)
    metrics = {
        "test_bleu": _seq2seq.corpus_bleu(tokenizer, references, hypotheses),
        "validation_loss": history["val_loss"][-1],
        "validation_token_accuracy": history["val_accuracy"][-1],
        "test_examples": len(test_sources),
        "parameters": lm.count_params(),
        "examples": examples,
    }
    if seq2seq_record is not None:
        metrics["seq2seq_test_bleu"] = seq2seq_record["metrics"]["test_bleu"]
    record = run.finish({args.preset: history}, metrics, steps_per_epoch)
    if seq2seq_record is not None:
        print_comparison(seq2seq_record, record)
    return record


def translate(lm, tokenizer, sources, sequence_length, batch_size):
    """Greedy translations of `sources` (strings): `source [SEP]` continued until [EOS], detokenized.

    Every batch holds `batch_size` prompts (the last is filled up with copies of its first),
    so `generate` compiles its loop for few shapes and reuses it.
    """
    prompts = kzoo.data.conditional_lm_prompts(sources, tokenizer, sequence_length)
    outputs = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        rows = lm.generate(
            chunk + chunk[:1] * (batch_size - len(chunk)), max_length=sequence_length, stop_token_ids=[EOS_ID]
        )
        for prompt, ids in zip(chunk, rows):
            ids = ids[len(prompt) :]
            ids = ids[: ids.index(EOS_ID)] if EOS_ID in ids else ids
            outputs.append(tokenizer.detokenize(ids) if ids else "")
    return outputs


def read_seq2seq_run(args):
    """The `metrics.json` record of the `--seq2seq-run` folder, or of `SEQ2SEQ_RUN` if it has one, else None."""
    folder = Path(args.seq2seq_run or SEQ2SEQ_RUN)
    path = folder / _common.METRICS_FILE
    if not path.is_file():
        if args.seq2seq_run:
            args.parser.error(
                f"--seq2seq-run {folder} holds no {_common.METRICS_FILE}: run seq2seq_translate.py first."
            )
        return None
    record = _common.read_record(path, ("metrics",))
    if record is None and not args.seq2seq_run:
        return None  # torn: as if the default run had not finished
    if record is None or record.get("recipe") != "seq2seq_translate" or "test_bleu" not in record["metrics"]:
        args.parser.error(f"{path} is not the record of a finished seq2seq_translate run.")
    return record


def print_comparison(seq2seq_record, record):
    """Prints the two runs' figures side by side."""
    print(f"\nBeside {seq2seq_record['recipe']} (test BLEU: same scorer, SacreBLEU 13a tokens, 4-grams):")
    print(f"  {'recipe':<18} {'model':<17} {'parameters':>10} {'validation loss':>15} {'test BLEU':>9}")
    for run_record in (seq2seq_record, record):
        metrics = run_record["metrics"]
        print(
            f"  {run_record['recipe']:<18} {run_record['settings']['preset']:<17} {metrics['parameters']:>10,}"
            f" {metrics['validation_loss']:>15.4f} {metrics['test_bleu']:>9.2f}"
        )
    scored = [(r["settings"]["dataset"], r["metrics"]["test_examples"]) for r in (seq2seq_record, record)]
    if scored[0] != scored[1]:
        print(f"  Not comparable: the runs scored different test pairs (dataset, count): {scored[0]} and {scored[1]}.")


if __name__ == "__main__":
    main()
