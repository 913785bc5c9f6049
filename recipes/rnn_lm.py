"""LSTM and GRU character language models on Tiny Shakespeare, at the GPT's parameter budget.

    python recipes/rnn_lm.py           # after gpt_lm.py, to compare with its perplexity
    python recipes/rnn_lm.py --quick   # a smoke run

The recurrent baselines the Transformer replaced (`kzoo.models.RNNLanguageModel`), trained
like `gpt_lm.py`: the same text, character tokenizer, windows, batches and optimizer, but by
default for 800 steps rather than the GPT's 1,500 (sequential recurrence is slower per
step on a CPU, and two models must fit in the recipe's time). Each cell gets one recurrent
layer whose width is chosen so that the whole model has as many parameters as the GPT that
`gpt_lm.py` trains with the same flags (nearest width in steps of 8 units).

Writes each model's checkpoints, logs and history into `lstm/` and `gru/` under the output
folder, and prints the validation perplexities side by side with the GPT's, read from
`--gpt-run`'s `metrics.json` when that run exists.
"""

import math
from pathlib import Path

import _common
import _language_models

import kzoo
import kzoo.data

DEFAULTS = dict(
    _language_models.DEFAULTS,
    # Two models to train, each about as slow per step as the GPT on a CPU: 800 steps each
    # keeps the run near the GPT's 1,500 steps, a default recipe run's budget.
    steps=800,
    cells="lstm,gru",
    embedding_dim=128,
    gpt_run=str(Path("runs", "gpt_lm")),
)
del DEFAULTS["prompt"], DEFAULTS["sample_length"]
QUICK = {key: value for key, value in _language_models.QUICK.items() if key in DEFAULTS}


def add_arguments(parser):
    _language_models.add_data_arguments(parser)
    parser.add_argument("--cells", help="comma-separated recurrent cells to train: lstm, gru, rnn")
    parser.add_argument("--embedding-dim", type=int, help="width of the character vectors")
    parser.add_argument("--gpt-run", help="the output folder of a gpt_lm.py run to compare with")


def main(argv=None):
    args = _common.parse_args(argv, __file__, __doc__, DEFAULTS, QUICK, add_arguments)
    cells = args.cells.split(",")
    unknown = sorted(set(cells) - set(kzoo.models.rnn.recurrent_stack.RECURRENT_LAYERS))
    if unknown:
        args.parser.error(f"Unknown --cells {unknown}; choose from lstm, gru, rnn.")
    run = _common.start(args)
    gpt = _language_models.language_model(args)
    budget, vocabulary_size = gpt.count_params(), gpt.backbone.vocabulary_size
    tokenizer = kzoo.data.character_tokenizer(vocabulary_size)

    train_windows = _common.text_windows(
        args, "train", tokenizer, args.sequence_length, args.batch_size, stride=1, shuffle=True
    )
    validation_windows = _common.text_windows(args, "validation", tokenizer, args.sequence_length, args.batch_size)
    if args.validation_batches:
        validation_windows = validation_windows.take(args.validation_batches)
    steps_per_epoch = _common.steps_per_epoch(args, int(train_windows.cardinality()))

    histories, metrics = {}, {"parameter_budget": budget}
    for cell in cells:
        hidden_dim = _language_models.rnn_width_for_budget(
            budget, vocabulary_size, args.embedding_dim, cell, args.dropout
        )
        with run.scope():
            model = _language_models.rnn_language_model(
                vocabulary_size, args.embedding_dim, hidden_dim, cell, args.dropout
            )
            _common.compile_task(model, args, steps_per_epoch, run.jit_compile)
        histories[cell] = run.fit(model, train_windows.repeat(), steps_per_epoch, validation_windows, name=cell)
        metrics[f"{cell}_hidden_dim"] = hidden_dim
        metrics[f"{cell}_parameters"] = model.count_params()
        metrics[f"{cell}_validation_loss"] = histories[cell]["val_loss"][-1]
        metrics[f"{cell}_validation_perplexity"] = histories[cell]["val_perplexity"][-1]

    metrics.update(read_gpt_run(args))
    print_comparison(metrics, cells)
    return run.finish(histories, metrics, steps_per_epoch)


def read_gpt_run(args):
    """The GPT's validation loss and perplexity from `--gpt-run`, if that run finished."""
    path = Path(args.gpt_run, _common.METRICS_FILE)
    if not path.is_file():
        print(f"No GPT run in {args.gpt_run} (run recipes/gpt_lm.py first to compare with it).")
        return {}
    record = _common.read_record(path, ("settings", "metrics"))
    if record is None:
        return {}
    settings = record["settings"]
    compared = ("dataset", "sequence_length", "batch_size", "steps", "epochs")
    different = [key for key in compared if settings.get(key) != getattr(args, key)]
    if different:
        print(f"Note: the GPT run in {args.gpt_run} used other settings for {', '.join(different)}.")
    return {
        "gpt_validation_loss": record["metrics"]["validation_loss"],
        "gpt_validation_perplexity": record["metrics"]["validation_perplexity"],
        "gpt_parameters": record["metrics"]["parameters"],
    }


def print_comparison(metrics, cells):
    rows = [(cell, metrics[f"{cell}_parameters"], metrics[f"{cell}_validation_loss"]) for cell in cells]
    if "gpt_validation_loss" in metrics:
        rows.append(("gpt", metrics["gpt_parameters"], metrics["gpt_validation_loss"]))
    print(f"\n{'model':<6} {'parameters':>10} {'val loss':>9} {'val ppl':>8}")
    for name, parameters, loss in rows:
        print(f"{name:<6} {parameters:>10,} {loss:>9.4f} {math.exp(loss):>8.3f}")


if __name__ == "__main__":
    main()
