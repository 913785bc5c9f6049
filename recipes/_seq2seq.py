"""What the sequence-to-sequence recipes share: flags, the (source, target) pairs, training, greedy decoding and BLEU.

`seq2seq_translate.py` trains and scores a translator with it, `seq2seq_summarize.py` a
summarizer, and `gpt_translate.py` reuses its flags, data and scoring for a decoder-only model.
"""

import _common
import keras_hub
import numpy as np

import kzoo
import kzoo.data
from kzoo.tokenizers.word_piece import BOS_ID
from kzoo.tokenizers.word_piece import EOS_ID

DEFAULTS = dict(
    preset="transformer_tiny",
    steps=None,
    epochs=3,
    batch_size=64,
    learning_rate=1e-3,
    dataset="kzoo_spa_eng",
    sequence_length=32,
    **_common.VOCABULARY_DEFAULTS,
    train_examples=None,
    bucket_boundaries="8,12,16,24",
    validation_batches=None,
    evaluation_examples=None,
    decode_batch_size=256,
)
QUICK = dict(
    epochs=2, steps=20, batch_size=16, **_common.VOCABULARY_QUICK, train_examples=2000, bucket_boundaries="",
    validation_batches=4, evaluation_examples=32, decode_batch_size=32,
)  # fmt: skip
EXAMPLES_SHOWN = 5


def add_arguments(
    parser, source="english", sequence_length_help="the most source and target tokens ([BOS]/[EOS] included)"
):
    parser.add_argument("--dataset", help=f"a dataset of ({source}, target) pairs with train, validation and test")
    parser.add_argument("--sequence-length", type=int, help=sequence_length_help)
    _common.add_vocabulary_arguments(parser)
    parser.add_argument("--train-examples", type=int, help="train on the first this many training pairs, or all")
    parser.add_argument(
        "--bucket-boundaries",
        help="comma-separated lengths: training pairs are grouped by length into batches padded to their "
        "longest (less compute on padding, a few more traces of the training step); empty: pad all to "
        "--sequence-length",
    )
    parser.add_argument("--validation-batches", type=int, help="validation batches per epoch, or all")
    parser.add_argument("--evaluation-examples", type=int, help="test pairs to decode and score, or all")
    parser.add_argument("--decode-batch-size", type=int, help="sources decoded together by generate")


def load_pairs(args):
    """`{"train", "validation", "test"}`: the `(source, target)` pairs of `--dataset`'s splits."""
    splits = ("train", "validation", "test")
    return {split: _common.load(args, args.dataset, split, as_supervised=True) for split in splits}


def training_texts(args, train):
    """The first `--train-examples` pairs of `train` (or all), and their sources and targets as lists of strings."""
    if args.train_examples:
        train = train.take(args.train_examples)
    sources = _common.strings(train.map(lambda source, target: source))
    targets = _common.strings(train.map(lambda source, target: target))
    return train, sources, targets


def train_seq2seq(args, run, train, validation, source_length, target_length, lowercase):
    """Fits the shared WordPiece vocabulary and trains a `--preset` Transformer on the `(source, target)` pairs.

    Uses the first `--train-examples` pairs, or all. Saves `model.keras` (with its tokenizer)
    into the output folder.

    Returns:
        `(model, tokenizer, history, steps_per_epoch)`.
    """
    train, sources, targets = training_texts(args, train)
    tokenizer = _common.word_piece_tokenizer(args, sources + targets, lowercase)

    def batches(dataset, **kwargs):
        return kzoo.data.seq2seq_batches(
            dataset, tokenizer, tokenizer, source_length, target_length, args.batch_size, **kwargs
        )

    boundaries = _common.bucket_boundaries(args) or []
    train_batches = batches(
        train,
        bucket_boundaries=[length for length in boundaries if length < max(source_length, target_length)] or None,
        shuffle_buffer_size=len(sources),
        seed=args.seed,
    ).repeat()
    # Fixed shapes: one trace, and a known length (Keras warns on each pass of a dataset without one).
    validation_batches = batches(validation)
    if args.validation_batches:
        validation_batches = validation_batches.take(args.validation_batches)
    steps_per_epoch = _common.steps_per_epoch(args, -(-len(sources) // args.batch_size))
    with run.scope():
        backbone = kzoo.models.Seq2SeqBackbone.from_preset(
            args.preset,
            vocabulary_size=tokenizer.vocabulary_size(),
            max_sequence_length=max(source_length, target_length),
        )
        model = kzoo.models.Seq2SeqTransformer(backbone, tokenizer=tokenizer)
        _common.compile_task(model, args, steps_per_epoch, run.jit_compile)
    history = run.fit(model, train_batches, steps_per_epoch, validation_batches)
    run.save(model)
    return model, tokenizer, history, steps_per_epoch


def test_pairs(test, limit):
    """The first `limit` (or all) test pairs as two lists of strings."""
    pairs = _common.pairs(test.take(limit) if limit else test)
    return [source.decode("utf-8") for source, _ in pairs], [target.decode("utf-8") for _, target in pairs]


def decode(model, tokenizer, sources, source_length, target_length, batch_size):
    """Greedy outputs for `sources` (strings), detokenized, without [BOS] and [EOS].

    Batches are padded to `batch_size` x `source_length`, so `generate` compiles its loop
    once and reuses it for every batch.
    """
    outputs = []
    for start in range(0, len(sources), batch_size):
        chunk = sources[start : start + batch_size]
        token_ids = np.zeros((batch_size, source_length), "int32")
        token_ids[len(chunk) :, 0] = EOS_ID  # Filler rows: generate needs a token in every row.
        for row, ids in zip(token_ids, tokenizer(chunk)):
            row[: min(len(ids), source_length)] = ids[:source_length]
        result = model.generate(token_ids, start_token_id=BOS_ID, max_length=target_length, stop_token_ids=[EOS_ID])
        for ids, mask in zip(result["token_ids"][: len(chunk)], result["padding_mask"][: len(chunk)]):
            ids = ids[mask][1:].tolist()  # Without [BOS].
            ids = ids[: ids.index(EOS_ID)] if EOS_ID in ids else ids
            outputs.append(tokenizer.detokenize(ids) if ids else "")
    return outputs


def normalize(tokenizer, text):
    """`text` tokenized and detokenized: spaced like the model's outputs."""
    return tokenizer.detokenize(tokenizer(text))


def corpus_bleu(tokenizer, references, hypotheses):
    """Corpus BLEU in percent of `hypotheses` against one reference each, normalized by `tokenizer`."""
    bleu = keras_hub.metrics.Bleu()
    bleu.update_state([[normalize(tokenizer, reference)] for reference in references], hypotheses)
    return 100 * float(bleu.result())


def show_examples(sources, references, hypotheses, count=EXAMPLES_SHOWN):
    """Prints and returns the first `count` (source, reference, output) triples."""
    examples = [{"source": s, "reference": r, "output": h} for s, r, h in zip(sources[:count], references, hypotheses)]
    for example in examples:
        print(
            f"\n  source:    {example['source']}\n  reference: {example['reference']}\n  output:    {example['output']}"
        )
    return examples
