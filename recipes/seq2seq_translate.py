"""English-to-Spanish translation with the Transformer: corpus BLEU on the test split, example translations.

    python recipes/seq2seq_translate.py           # transformer_tiny on the spa-eng pairs
    python recipes/seq2seq_translate.py --quick   # a smoke run

Trains `kzoo.models.Seq2SeqTransformer` with teacher forcing on the `train` pairs of
`kzoo_spa_eng` (the builder's seeded 80/10/10 split), validates on `validation` after each
epoch, then translates the `test` English sentences greedily with `generate` (the encoder
once, the decoder one token at a time against its key/value cache) and scores them with
corpus BLEU (`keras_hub.metrics.Bleu`: SacreBLEU's 13a tokenization, 4-grams, no smoothing).

Source and target share one cased WordPiece vocabulary, fitted on a sample of the training
sentences of both sides (`--vocabulary-texts`), as the model ties its source, target and
output embeddings. References pass through
the same tokenizer and back before scoring, so both sides of BLEU are spaced the same way.
"""

import _common
import _seq2seq


def main(argv=None):
    args = _common.parse_args(argv, __file__, __doc__, _seq2seq.DEFAULTS, _seq2seq.QUICK, _seq2seq.add_arguments)
    run = _common.start(args)
    splits = _seq2seq.load_pairs(args)
    model, tokenizer, history, steps_per_epoch = _seq2seq.train_seq2seq(
        args, run, splits["train"], splits["validation"], args.sequence_length, args.sequence_length, lowercase=False
    )

    sources, references = _seq2seq.test_pairs(splits["test"], args.evaluation_examples)
    hypotheses = _seq2seq.decode(
        model, tokenizer, sources, args.sequence_length, args.sequence_length, args.decode_batch_size
    )
    examples = _seq2seq.show_examples(sources, references, hypotheses)
    metrics = {
        "test_bleu": _seq2seq.corpus_bleu(tokenizer, references, hypotheses),
        "validation_loss": history["val_loss"][-1],
        "validation_token_accuracy": history["val_accuracy"][-1],
        "test_examples": len(sources),
        "parameters": model.count_params(),
        "examples": examples,
    }
    return run.finish({args.preset: history}, metrics, steps_per_epoch)


if __name__ == "__main__":
    main()
