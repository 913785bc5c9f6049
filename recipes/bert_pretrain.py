"""BERT masked-language-model pretraining on the English text of kzoo's shipped corpora.

    python recipes/bert_pretrain.py           # bert_tiny; then fine-tune it:
    python recipes/bert_classify.py --checkpoint runs/bert_pretrain   # (or bert_tag.py)
    python recipes/bert_pretrain.py --quick   # a smoke run

Gathers the unlabelled text of the training splits of `--datasets` (labels are dropped; no
validation or test text is read, so the fine-tuning recipes evaluate on text this model
never saw), fits a cased WordPiece vocabulary on a sample of it (`--vocabulary-texts`;
`--no-cased` lowercases), and trains `kzoo.models.BertMaskedLM` with BERT's masking (15% of
the tokens: 80% [MASK], 10% random, 10% kept; `kzoo.data.masked_lm_batches`). The texts are
packed into full rows (`--pack`, RoBERTa's full sentences): most are short (the English side
of spa-eng averages 9 tokens), and padded one to a row they filled 15 of its 64 positions, so
packing puts ~4x the tokens and masked targets into each step for the same cost. A seeded 2%
of the texts is held out to validate on (packed the same way).

Saves `model.keras`, which carries its tokenizer, into the output folder; `--checkpoint` (or
`--pretrained`) of the fine-tuning recipes reads that folder.
"""

import argparse

import _common
import tensorflow as tf

import kzoo
import kzoo.data

# The English text of each corpus: the features holding it.
TEXT_FEATURES = {
    "kzoo_rt_polarity": "text",
    "kzoo_sentiment_sentences": "text",
    "kzoo_ud_english_ewt": "text",
    "kzoo_wnut17": "tokens",
    "kzoo_scitldr": "source",
    "kzoo_spa_eng": "english",
}
DEFAULTS = dict(
    preset="bert_tiny",
    steps=4000,
    epochs=4,
    batch_size=64,
    learning_rate=1e-3,
    datasets=",".join(TEXT_FEATURES),
    sequence_length=64,
    max_sequence_length=128,
    **_common.VOCABULARY_DEFAULTS,
    max_texts=None,
    cased=True,
    pack=True,
)
QUICK = dict(epochs=2, steps=20, batch_size=16, **_common.VOCABULARY_QUICK, datasets="kzoo_rt_polarity", max_texts=2000)
VALIDATION_FRACTION = 0.02


def add_arguments(parser):
    parser.add_argument("--datasets", help="comma-separated kzoo datasets whose training text to use")
    parser.add_argument("--sequence-length", type=int, help="tokens per example, [CLS] and [SEP] included")
    parser.add_argument(
        "--max-sequence-length", type=int, help="positions of the backbone: the longest input fine-tuning can use"
    )
    _common.add_vocabulary_arguments(parser)
    parser.add_argument("--max-texts", type=int, help="use only this many texts, a seeded sample (default: all)")
    parser.add_argument(
        "--cased",
        action=argparse.BooleanOptionalAction,
        help="keep letter case, which tells proper nouns apart; --no-cased lowercases everything",
    )
    parser.add_argument(
        "--pack",
        action=argparse.BooleanOptionalAction,
        help="pack the texts into full rows of --sequence-length tokens; --no-pack gives each text its padded row",
    )


def main(argv=None):
    args = _common.parse_args(argv, __file__, __doc__, DEFAULTS, QUICK, add_arguments)
    run = _common.start(args)
    texts = corpus_texts(args)
    splits = kzoo.data.seeded_split(
        texts, {"train": 1 - VALIDATION_FRACTION, "validation": VALIDATION_FRACTION}, args.seed
    )
    print(f"{len(splits['train']):,} training and {len(splits['validation']):,} validation texts.")
    tokenizer = _common.word_piece_tokenizer(args, splits["train"], lowercase=not args.cased)

    def batches(split, **shuffle):
        texts = tf.data.Dataset.from_tensor_slices(splits[split])
        return kzoo.data.masked_lm_batches(
            texts, tokenizer, args.sequence_length, args.batch_size, pack=args.pack, seed=args.seed, **shuffle
        )

    train = batches("train", shuffle_buffer_size=len(splits["train"]))
    # Packing leaves the number of batches to tf.data's unknown: counted, so that each evaluation
    # ends on the count and not on running out of data (which Keras warns of).
    validation = batches("validation")
    validation = validation.apply(tf.data.experimental.assert_cardinality(_count(validation)))
    steps_per_epoch = _common.steps_per_epoch(args, None if args.steps else _count(train))
    with run.scope():
        backbone = kzoo.models.BertBackbone.from_preset(
            args.preset,
            vocabulary_size=tokenizer.vocabulary_size(),
            max_sequence_length=max(args.max_sequence_length, args.sequence_length),
        )
        model = kzoo.models.BertMaskedLM(backbone, tokenizer=tokenizer)
        _common.compile_task(model, args, steps_per_epoch, run.jit_compile)
    history = run.fit(model, train.repeat(), steps_per_epoch, validation_data=validation)

    run.save(model)
    metrics = {
        "validation_masked_accuracy": history["val_accuracy"][-1],
        "validation_masked_perplexity": history["val_perplexity"][-1],
        "training_loss": history["loss"][-1],
        "texts": len(texts),
        "vocabulary_size": tokenizer.vocabulary_size(),
        "parameters": model.count_params(),
    }
    return run.finish({args.preset: history}, metrics, steps_per_epoch)


def corpus_texts(args):
    """The training text of every dataset in `--datasets`, as a list of strings."""
    names = args.datasets.split(",")
    unknown = sorted(set(names) - set(TEXT_FEATURES))
    if unknown:
        args.parser.error(f"--datasets: no English text known for {unknown}; choose from {sorted(TEXT_FEATURES)}.")
    texts = []
    for name in names:
        feature = TEXT_FEATURES[name]
        texts += _common.strings(_common.load(args, name, "train").map(lambda example: _text(example[feature])))
    if args.max_texts is not None and args.max_texts < len(texts):
        texts = kzoo.data.seeded_split(texts, {"sample": 1.0}, args.seed)["sample"][: args.max_texts]
    return texts


def _count(dataset):
    """The number of elements of a finite dataset, by one pass over it."""
    return int(dataset.reduce(0, lambda count, _: count + 1))


def _text(value):
    """A string feature, or a list of tokens (WNUT-17) joined back into a sentence."""
    return tf.strings.reduce_join(value, separator=" ") if value.shape.rank else value


if __name__ == "__main__":
    main()
