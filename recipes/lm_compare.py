"""Five character language models on Tiny Shakespeare, at one parameter budget and one time budget.

    python recipes/lm_compare.py           # 5 models x 120 s of training each, plus evaluation
    python recipes/lm_compare.py --quick   # a smoke run in well under a minute

The sequence models of the course, trained like `gpt_lm.py` (the same text, character
tokenizer, training windows, batches and optimizer):

- `feed_forward`: `kzoo.models.FeedForwardLanguageModel` (Bengio et al., 2003), which sees
  the last `--window-size` characters;
- `rnn`, `lstm`, `gru`: `kzoo.models.RNNLanguageModel`, one recurrent layer (as `rnn_lm.py`);
- `gpt`: the `--preset` GPT of `gpt_lm.py`.

The GPT's parameter count is the budget: each other model gets the hidden width (a multiple
of 8) that brings its whole model nearest to it, within `BUDGET_TOLERANCE`. Each model then
trains for `--seconds-per-model` seconds (or `--steps` steps, if it gets there first), so
the table compares what each architecture learns in equal time, not in equal steps: a
step of the feed-forward model costs a fraction of a recurrent one.

The clock counts training steps only: it starts once the first step (which traces the
training function) is done and pauses while the model is evaluated. Validation perplexity
is measured after the first step and then `--evaluations` times, evenly spaced over the
model's time, on the first `--validation-batches` batches of the validation split. The
learning rate warms up over `WARMUP_STEPS` steps and then stays at `--learning-rate`: how
many steps a model will get is not known ahead, so no schedule could decay to its end.

Writes into the output folder `metrics.json` (the table, and each model's curve) and
`perplexity_vs_time.png`, validation perplexity over training time, one line per model.
"""

import time

import _common
import _language_models
import keras
import matplotlib
from matplotlib.figure import Figure

import kzoo
import kzoo.data
import kzoo.files
import kzoo.training

MODELS = ("feed_forward", "rnn", "lstm", "gru", "gpt")
DEFAULTS = dict(
    _language_models.DEFAULTS,
    steps=None,
    models=",".join(MODELS),
    seconds_per_model=120.0,
    evaluations=8,
    validation_batches=8,
    embedding_dim=64,
    window_size=8,
)
del DEFAULTS["epochs"], DEFAULTS["prompt"], DEFAULTS["sample_length"]
QUICK = dict(
    {key: _language_models.QUICK[key] for key in ("batch_size", "sequence_length")},
    seconds_per_model=1.0,
    evaluations=1,
    validation_batches=2,
)
PLOT_FILE = "perplexity_vs_time.png"
# How far from the GPT's parameter count another model may be.
BUDGET_TOLERANCE = 0.03
WARMUP_STEPS = 20


def add_arguments(parser):
    _language_models.add_data_arguments(parser)
    parser.add_argument("--models", help=f"comma-separated models to train: {', '.join(MODELS)}")
    parser.add_argument("--seconds-per-model", type=float, help="training time of each model, in seconds")
    parser.add_argument("--evaluations", type=int, help="validations of each model after the first step")
    parser.add_argument("--embedding-dim", type=int, help="width of the character vectors of all but the GPT")
    parser.add_argument("--window-size", type=int, help="characters the feed-forward model sees")


def main(argv=None):
    args = _common.parse_args(argv, __file__, __doc__, DEFAULTS, QUICK, add_arguments)
    names = check_arguments(args)
    run = _common.start(args)
    gpt = _language_models.language_model(args)
    budget, vocabulary_size = gpt.count_params(), gpt.backbone.vocabulary_size
    widths = {name: width_for_budget(name, args, vocabulary_size, budget) for name in names}
    tokenizer = kzoo.data.character_tokenizer(vocabulary_size)

    validation_windows = _common.text_windows(args, "validation", tokenizer, args.sequence_length, args.batch_size)
    validation_windows = validation_windows.take(args.validation_batches)

    run.claim()  # every flag is checked: the run takes its folder before it trains
    table, curves = [], {}
    for name in names:
        # Every model starts from the same seed and sees the same batches: a new stream
        # each, as every pass over a seeded stream is shuffled anew.
        keras.utils.set_random_seed(args.seed)
        train = _common.text_windows(
            args, "train", tokenizer, args.sequence_length, args.batch_size, stride=1, shuffle=True
        )
        validation = validation_windows
        with run.scope():
            model = language_model(name, args, vocabulary_size, widths[name])
            model.compile(learning_rate=args.learning_rate, warmup_steps=WARMUP_STEPS, jit_compile=run.jit_compile)
        if name == "gpt":
            train, validation = train.map(_language_models.gpt_inputs), validation.map(_language_models.gpt_inputs)
        clock = TrainingClock(name, args.seconds_per_model, args.evaluations, validation)
        with _common.stop_on_divergence(args, run.output_dir):
            model.fit(
                kzoo.training.shard_by_data(train.repeat()),
                steps_per_epoch=args.steps,
                callbacks=[keras.callbacks.TerminateOnNaN(raise_error=True), clock],
                shuffle=False,
                verbose=0,
            )
        curves[name] = clock.curve
        table.append(
            {
                "model": name,
                "hidden_dim": widths[name],
                "parameters": model.count_params(),
                "steps": clock.steps,
                "training_seconds": round(clock.trained, 1),
                "validation_loss": clock.curve["validation_loss"][-1],
                "validation_perplexity": clock.curve["validation_perplexity"][-1],
            }
        )

    print_table(table, budget)
    if run.is_chief:
        plot_curves(curves, run.path(PLOT_FILE), f"Character LMs on {args.dataset}, {budget:,} parameters each")
    metrics = {
        "parameter_budget": budget,
        "budget_tolerance": BUDGET_TOLERANCE,
        "seconds_per_model": args.seconds_per_model,
        "table": table,
        "curves": curves,
    }
    return run.finish({}, metrics, steps_per_epoch=None)


def check_arguments(args):
    """The models to train, in order; exits with a message on flags that make no sense here."""
    names = list(dict.fromkeys(name.strip() for name in args.models.split(",")))
    unknown = [name for name in names if name not in MODELS]
    if unknown or not names:
        args.parser.error(f"Unknown --models {unknown or names}; choose from {', '.join(MODELS)}.")
    if args.epochs is not None:
        args.parser.error("--epochs does not apply: each model trains for --seconds-per-model (or --steps).")
    if not args.seconds_per_model > 0:
        args.parser.error(f"--seconds-per-model must be > 0; received {args.seconds_per_model}.")
    for flag in ("evaluations", "validation_batches", "embedding_dim", "window_size"):
        if getattr(args, flag) < 1:
            args.parser.error(f"--{flag.replace('_', '-')} must be >= 1; received {getattr(args, flag)}.")
    return names


def language_model(name, args, vocabulary_size, width):
    """The model `name`, of hidden width `width` (the GPT keeps its preset's)."""
    if name == "gpt":
        return _language_models.language_model(args)
    if name == "feed_forward":
        return kzoo.models.FeedForwardLanguageModel(
            vocabulary_size, args.window_size, args.embedding_dim, width, dropout=args.dropout, name="feed_forward_lm"
        )
    return _language_models.rnn_language_model(vocabulary_size, args.embedding_dim, width, name, args.dropout)


def width_for_budget(name, args, vocabulary_size, budget):
    """The hidden width of model `name` nearest the parameter `budget` (None for the GPT);
    exits with a message when even the nearest is not within `BUDGET_TOLERANCE`."""
    if name == "gpt":
        return None
    width = _common.width_for_budget(
        lambda width: language_model(name, args, vocabulary_size, width).count_params(),
        budget,
        _language_models.WIDTH_STEP,
    )
    parameters = language_model(name, args, vocabulary_size, width).count_params()
    if abs(parameters - budget) > BUDGET_TOLERANCE * budget:
        args.parser.error(
            f"No width of {name} comes within {BUDGET_TOLERANCE:.0%} of the GPT's {budget:,} parameters "
            f"(nearest: {parameters:,}); change --embedding-dim or --window-size."
        )
    return width


class TrainingClock(keras.callbacks.Callback):
    """Stops training after `seconds` of training steps and validates on the way.

    The clock starts when the first step ends (it traced the training function, which
    takes each model a different time) and pauses during validation. Validates after the
    first step, then every `seconds / evaluations` seconds, and once more at the end if
    `fit` stopped before the time was up.

    Args:
        name: the model's name, for the progress lines.
        seconds: float, the training time.
        evaluations: int, validations after the first one.
        validation_data: a finite dataset.

    Attributes:
        curve: `{"training_seconds", "steps", "validation_loss", "validation_perplexity"}`,
            a list each, one entry per validation.
        steps: int, the steps trained.
        trained: float, the seconds trained (the first step not counted).
    """

    def __init__(self, name, seconds, evaluations, validation_data):
        super().__init__()
        self.name, self.seconds, self.validation_data = name, seconds, validation_data
        self.interval = seconds / evaluations
        self.curve = {"training_seconds": [], "steps": [], "validation_loss": [], "validation_perplexity": []}
        self.steps, self.trained = 0, 0.0
        self.next_validation = 0.0
        self.step_start = None

    def on_train_batch_begin(self, batch, logs=None):
        self.step_start = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        if self.steps > 0:
            self.trained += time.monotonic() - self.step_start
        self.steps += 1
        if self.trained >= self.next_validation:
            self.validate()
            while self.next_validation <= self.trained:
                self.next_validation += self.interval
        if self.trained >= self.seconds:
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        if self.curve["steps"][-1] != self.steps:
            self.validate()

    def validate(self):
        # `evaluate` resets the running training metrics, which this recipe does not report.
        results = self.model.evaluate(self.validation_data, verbose=0, return_dict=True)
        for key, value in (
            ("training_seconds", round(self.trained, 2)),
            ("steps", self.steps),
            ("validation_loss", results["loss"]),
            ("validation_perplexity", results["perplexity"]),
        ):
            self.curve[key].append(value)
        perplexity = results["perplexity"]
        print(f"{self.name:<12} {self.trained:7.1f} s  step {self.steps:6,}  validation perplexity {perplexity:8.3f}")


def print_table(table, budget):
    print(f"\nValidation perplexity at {budget:,} parameters (the GPT's), after equal training time:")
    print(f"{'model':<12} {'parameters':>10} {'steps':>7} {'train s':>8} {'val loss':>9} {'val ppl':>8}")
    for row in table:
        print(
            f"{row['model']:<12} {row['parameters']:>10,} {row['steps']:>7,} {row['training_seconds']:>8.1f} "
            f"{row['validation_loss']:>9.4f} {row['validation_perplexity']:>8.3f}"
        )


def plot_curves(curves, path, title):
    """Validation perplexity over training time, one line per model (log scale)."""
    # A bare Figure, not pyplot: no display backend or global figure state is involved.
    figure = Figure(figsize=(7, 4.5), layout="constrained")
    axis = figure.subplots()
    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    for (name, curve), color in zip(curves.items(), colors):
        label = f"{name} ({curve['steps'][-1]:,} steps)"
        axis.plot(curve["training_seconds"], curve["validation_perplexity"], marker="o", color=color, label=label)
    axis.set_yscale("log")
    axis.set_xlabel("training time (s)")
    axis.set_ylabel("validation perplexity (per character)")
    axis.set_title(title)
    axis.grid(alpha=0.3, which="both")
    axis.legend()
    with kzoo.files.atomic_file(path, mode=None) as staging:  # the format from the name's suffix
        figure.savefig(staging, dpi=100)


if __name__ == "__main__":
    main()
