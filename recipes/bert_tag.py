"""BERT token tagging: UPOS on UD English-EWT (accuracy) and named entities on WNUT-17 (entity F1).

    python recipes/bert_tag.py                                   # both tasks, bert_tiny from scratch
    python recipes/bert_tag.py --checkpoint minilm               # fine-tune all-MiniLM-L6-v2
    python recipes/bert_tag.py --checkpoint runs/bert_pretrain   # from a bert_pretrain.py run
    python recipes/bert_tag.py --tasks ner --quick               # one task, a smoke run

Fine-tunes one `kzoo.models.BertTokenClassifier` per task, from scratch or from
`--checkpoint` (see `bert_classify.py`; its settings: `CHECKPOINT_DEFAULTS`). Each word's
label sits on one word piece: from scratch its last, where its suffix is (`--label-piece
first` for BERT's usual first piece: UPOS dev 0.857 against 0.875 from one earlier
pretraining), from a checkpoint its first; its other pieces, [CLS], [SEP] and padding weigh 0
in the loss and the metrics (`kzoo.data.tagging_batches`), so the accuracy counts each word
once. Batches are padded to their longest sentence (`--bucket-boundaries`).

- upos: trains on the EWT training subset, reports word accuracy on the dev set
  (`validation`), evaluated after each epoch.
- ner: trains on the WNUT-17 training set, validates on dev after each epoch and reports
  entity-level precision, recall and F1 on dev and test: an entity counts when its span
  and type both match (CoNLL `conlleval` chunking of the BIO tags). Words cut off by
  `--sequence-length` are predicted "O".

Each task's files go into a subfolder (`upos/`, `ner/`) of the output folder.
"""

import math

import _bert
import _common
import numpy as np

import kzoo
import kzoo.data
from kzoo.data.corpora import WNUT17_TAGS

TASKS = {
    "upos": {"dataset": "kzoo_ud_english_ewt", "validation": "validation"},
    "ner": {"dataset": "kzoo_wnut17", "validation": "validation", "entity_splits": ("validation", "test")},
}
DEFAULTS = dict(
    preset="bert_tiny",
    steps=None,
    epochs=10,
    batch_size=32,
    learning_rate=2e-3,
    tasks="upos,ner",
    sequence_length=128,
    label_piece="last",
    bucket_boundaries="16,32,48,64",
    **_common.VOCABULARY_DEFAULTS,
)
# A pretrained encoder fine-tunes with a smaller learning rate.
CHECKPOINT_DEFAULTS = dict(epochs=3, learning_rate=2e-4, label_piece="first")
QUICK = dict(epochs=2, steps=16, batch_size=16, **_common.VOCABULARY_QUICK, sequence_length=64)


def add_arguments(parser):
    parser.add_argument("--tasks", help=f"comma-separated tasks: {', '.join(TASKS)}")
    parser.add_argument("--sequence-length", type=int, help="word pieces per sentence, [CLS] and [SEP] included")
    parser.add_argument("--label-piece", choices=("first", "last"), help="the word piece that carries a word's label")
    parser.add_argument(
        "--bucket-boundaries",
        help="comma-separated lengths to batch sentences by, each padded to its bucket's; 'none': --sequence-length",
    )
    _common.add_vocabulary_arguments(parser)
    _common.add_checkpoint_argument(parser)


def main(argv=None):
    args = _common.parse_args(argv, __file__, __doc__, DEFAULTS, QUICK, add_arguments, CHECKPOINT_DEFAULTS)
    tasks = args.tasks.split(",")
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        args.parser.error(f"Unknown --tasks {unknown}; choose from {', '.join(TASKS)}.")
    run = _common.start(args)
    histories, metrics, steps_per_epoch = {}, {}, None
    for task in tasks:
        history, task_metrics, steps_per_epoch = train_tagger(args, run, task)
        histories[task] = history
        metrics.update({f"{task}_{name}": value for name, value in task_metrics.items()})
    return run.finish(histories, metrics, steps_per_epoch)


def train_tagger(args, run, task):
    """Trains the tagger of `task`; returns its history, metrics and steps per epoch."""
    spec = TASKS[task]
    splits = {
        split: _common.load(args, spec["dataset"], split, as_supervised=True)
        for split in {"train", spec["validation"], *spec.get("entity_splits", ())}
    }
    sentences = [b" ".join(words).decode("utf-8") for words, _ in splits["train"].as_numpy_iterator()]
    backbone, tokenizer = _bert.backbone_and_tokenizer(args, run, sentences, lowercase=False)

    def batches(split, bucket_boundaries=_common.bucket_boundaries(args), **shuffle):
        return kzoo.data.tagging_batches(
            splits[split],
            tokenizer,
            args.sequence_length,
            args.batch_size,
            label_piece=args.label_piece,
            bucket_boundaries=bucket_boundaries,
            **_common.bert_special_ids(tokenizer),
            **shuffle,
        )

    num_tags = 1 + int(max(max(tags) for _, tags in splits["train"].as_numpy_iterator()))
    steps_per_epoch = _common.steps_per_epoch(args, math.ceil(len(sentences) / args.batch_size))
    with run.scope():
        tagger = kzoo.models.BertTokenClassifier(backbone, num_tags, tokenizer=tokenizer)
        _common.compile_task(tagger, args, steps_per_epoch, run.jit_compile)
    train = batches("train", shuffle_buffer_size=len(sentences), seed=args.seed).repeat()
    history = run.fit(tagger, train, steps_per_epoch, batches(spec["validation"]), name=task)
    run.save(tagger, name=task)

    metrics = {f"{spec['validation']}_accuracy": history["val_accuracy"][-1]}
    metrics.update(evaluate_entities(tagger, batches, splits, spec.get("entity_splits", ())))
    return history, metrics, steps_per_epoch


def evaluate_entities(tagger, batches, splits, split_names):
    """`{"<split>_entity_{precision,recall,f1}"}` of `tagger` on each split in `split_names`.

    Args:
        tagger: a `BertTokenClassifier`.
        batches: `batches(split, bucket_boundaries=...)`, the split's tagging batches.
        splits: `{split: dataset of (words, tags)}`, the gold tags.
        split_names: the splits to score.
    """
    metrics = {}
    for split in split_names:
        # Unbucketed: bucketing reorders the sentences, and predictions pair with the gold ones by position.
        predicted = predict_word_tags(tagger, batches(split, bucket_boundaries=None))
        gold = [tags.tolist() for _, tags in splits[split].as_numpy_iterator()]
        scores = entity_scores(gold, predicted)
        metrics.update({f"{split}_entity_{name}": value for name, value in scores.items()})
    return metrics


def predict_word_tags(tagger, batches):
    """The predicted tag of every word, per sentence: the argmax at each word's labelled piece."""
    sentences = []
    for x, _, weights in batches:
        tags = np.argmax(tagger.predict_on_batch(x), axis=-1)
        labelled = np.asarray(weights) > 0
        sentences += [row[mask].tolist() for row, mask in zip(tags, labelled)]
    return sentences


def entity_scores(gold, predicted, tag_names=WNUT17_TAGS):
    """Entity-level precision, recall and F1 of BIO tag ids, per sentence.

    `predicted` sentences may be shorter than `gold` ones (truncated): the missing words
    count as "O".
    """
    gold_entities, predicted_entities = set(), set()
    for index, (gold_tags, predicted_tags) in enumerate(zip(gold, predicted, strict=True)):
        predicted_tags = predicted_tags + [0] * (len(gold_tags) - len(predicted_tags))
        gold_entities |= {(index, *span) for span in bio_entities([tag_names[t] for t in gold_tags])}
        predicted_entities |= {(index, *span) for span in bio_entities([tag_names[t] for t in predicted_tags])}
    correct = len(gold_entities & predicted_entities)
    precision = correct / len(predicted_entities) if predicted_entities else 0.0
    recall = correct / len(gold_entities) if gold_entities else 0.0
    f1 = 2 * precision * recall / (precision + recall) if correct else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def bio_entities(tags):
    """The entities `(start, end, type)` of a BIO tag sequence, `end` exclusive.

    As in CoNLL's `conlleval`: an entity starts at `B-X`, or at `I-X` that does not continue
    an entity of type X, and runs over the `I-X` tags after it.

    Example:
    >>> bio_entities(["B-person", "I-person", "O", "I-location", "B-location"])
    [(0, 2, 'person'), (3, 4, 'location'), (4, 5, 'location')]
    """
    entities, start, kind = [], None, None
    for position, tag in enumerate([*tags, "O"]):
        prefix, _, tag_kind = tag.partition("-")
        continues = prefix == "I" and tag_kind == kind
        if start is not None and not continues:
            entities.append((start, position, kind))
            start, kind = None, None
        if prefix == "B" or (prefix == "I" and not continues):
            start, kind = position, tag_kind
    return entities


if __name__ == "__main__":
    main()
