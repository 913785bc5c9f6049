"""Extreme summarization of paper abstracts (SciTLDR-A) with the Transformer: ROUGE-1/2/L.

    python recipes/seq2seq_summarize.py           # transformer_tiny on the 1,992 training abstracts
    python recipes/seq2seq_summarize.py --quick   # a smoke run

Trains `kzoo.models.Seq2SeqTransformer` from scratch to write the one-sentence TLDR of an
abstract (`kzoo_scitldr`: `source` -> `target`, the author's TLDR), exactly as
`seq2seq_translate.py` trains a translator, then summarizes the 619 dev abstracts greedily
and scores them against all their TLDRs (1 to 4), keeping the best-matching one per paper
as the SciTLDR paper does. Scores are F1 in percent, averaged over papers.

ROUGE is computed here as Google's `rouge_score` package computes it (which
`keras_hub.metrics.RougeN`/`RougeL` wrap, but which is not installed with kzoo): text
lower-cased and split into runs of letters and digits, no stemming; ROUGE-N from clipped
n-gram counts, ROUGE-L from the longest common subsequence.

Two thousand examples are very few for a model trained from scratch: expect fluent,
generic TLDRs that share the field's vocabulary with the reference more than its content.
"""

import collections
import re

import _common
import _seq2seq
import numpy as np

DEFAULTS = dict(
    preset="transformer_tiny",
    steps=None,
    epochs=10,
    batch_size=16,
    learning_rate=1e-3,
    dataset="kzoo_scitldr",
    sequence_length=256,
    target_length=48,
    train_examples=None,
    bucket_boundaries="",
    **_common.VOCABULARY_DEFAULTS,
    validation_batches=None,
    evaluation_examples=None,
    decode_batch_size=64,
)
QUICK = dict(_seq2seq.QUICK, sequence_length=128, target_length=24)


def add_arguments(parser):
    _seq2seq.add_arguments(parser, source="abstract")
    parser.add_argument("--target-length", type=int, help="the most summary tokens ([BOS]/[EOS] included)")


def main(argv=None):
    args = _common.parse_args(argv, __file__, __doc__, DEFAULTS, QUICK, add_arguments)
    run = _common.start(args)
    splits = {split: _common.load(args, args.dataset, split) for split in ("train", "validation")}
    pairs = {split: dataset.map(lambda paper: (paper["source"], paper["target"])) for split, dataset in splits.items()}
    model, tokenizer, history, steps_per_epoch = _seq2seq.train_seq2seq(
        args, run, pairs["train"], pairs["validation"], args.sequence_length, args.target_length, lowercase=True
    )

    papers = splits["validation"].take(args.evaluation_examples) if args.evaluation_examples else splits["validation"]
    papers = list(papers.as_numpy_iterator())
    sources = [paper["source"].decode("utf-8") for paper in papers]
    references = [[target.decode("utf-8") for target in paper["targets"]] for paper in papers]
    summaries = _seq2seq.decode(
        model, tokenizer, sources, args.sequence_length, args.target_length, args.decode_batch_size
    )
    scores = {name: 100 * np.mean([max(score(r, s) for r in refs) for refs, s in zip(references, summaries)])
              for name, score in ROUGE.items()}  # fmt: skip
    examples = _seq2seq.show_examples(
        [source[:300] + "..." for source in sources], [refs[0] for refs in references], summaries
    )
    metrics = {
        **{f"validation_{name}": value for name, value in scores.items()},
        "validation_loss": history["val_loss"][-1],
        "validation_examples": len(sources),
        "parameters": model.count_params(),
        "examples": examples,
    }
    return run.finish({args.preset: history}, metrics, steps_per_epoch)


def rouge_tokens(text):
    """`rouge_score`'s default tokenization: lower-cased runs of letters and digits."""
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).split()


def f1(overlap, predicted, reference):
    if overlap == 0:
        return 0.0
    precision, recall = overlap / predicted, overlap / reference
    return 2 * precision * recall / (precision + recall)


def rouge_n(order):
    """ROUGE-N F1 of one summary against one reference."""

    def score(reference, summary):
        counts = [
            collections.Counter(zip(*(tokens[i:] for i in range(order))))
            for tokens in (rouge_tokens(reference), rouge_tokens(summary))
        ]
        overlap = sum((counts[0] & counts[1]).values())
        return f1(overlap, sum(counts[1].values()), sum(counts[0].values()))

    return score


def rouge_l(reference, summary):
    """ROUGE-L F1: from the longest common subsequence of the two token lists."""
    reference, summary = rouge_tokens(reference), rouge_tokens(summary)
    previous = [0] * (len(summary) + 1)
    for token in reference:
        current = [0]
        for j, other in enumerate(summary):
            current.append(previous[j] + 1 if token == other else max(previous[j + 1], current[j]))
        previous = current
    return f1(previous[-1], len(summary), len(reference))


ROUGE = {"rouge1": rouge_n(1), "rouge2": rouge_n(2), "rougeL": rouge_l}


if __name__ == "__main__":
    main()
