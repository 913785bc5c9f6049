"""Character-level GPT on Tiny Shakespeare: validation loss and perplexity, a sample, the saved model.

    python recipes/gpt_lm.py           # gpt_tiny, the full run (its loss in the README, its time in BENCHMARKS.md)
    python recipes/gpt_lm.py --short   # the README's main job: 1,000 steps of 16 windows, to ~2.05 nats/char
    python recipes/gpt_lm.py --quick   # a smoke run (what the tests use)

Trains `kzoo.models.GPTCausalLM` on windows of the first 90% of the text (the `train` split of
`kzoo_tiny_shakespeare`) and validates on the last 10%. A token is one character, its Unicode
code point (`kzoo.data.character_tokenizer`), so the tokenizer has nothing to fit and
the loss is in nats per character. Training windows start at every character, shuffled with
`--seed`; validation windows tile the validation text.

After training it continues `--prompt` with `generate` (top-k sampling), saves `model.keras`
(which carries its tokenizer) into the output folder, reloads it and checks that the
reloaded model gives the same logits and the same sample, and plots the attention of every
head of the last block over the start of the sample (`attention.png`). The model has
`--sequence-length` positions, the length it was trained on. To use the model later:

    lm = keras.saving.load_model("runs/gpt_lm/model.keras", compile=False)  # after `import kzoo`
    print(lm.generate("ROMEO:", max_new_tokens=100, sampler="top_k"))
"""

import math
import sys

import _common
import _language_models
import keras
import numpy as np

import kzoo
import kzoo.data
import kzoo.visualization

# The README's main job: enough training that a sample reads like words (validation loss
# below 2.1 nats/char) in a few minutes on a CPU. Half the full run's batch: on a small
# budget more, smaller steps go further than fewer, larger ones.
SHORT = dict(steps=1000, epochs=2, batch_size=16)
# The start of the sample whose attention `attention.png` shows.
ATTENTION_CHARACTERS = 40
# Near-greedy sampling: diverse enough to read like the text, without its rare-character noise.
TOP_K = 5


def add_arguments(parser):
    _language_models.add_data_arguments(parser)
    parser.add_argument("--short", action="store_true", help=f"the README's main job, a shorter training run: {SHORT}")
    parser.add_argument("--prompt", help="the text the sample continues")
    parser.add_argument("--sample-length", type=int, help="characters to generate after the prompt")


def parse_args(argv=None):
    """The flags; `--short` puts `SHORT` in place of the defaults, flags given still win."""
    short = "--short" in (sys.argv[1:] if argv is None else argv)
    defaults = {**_language_models.DEFAULTS, **SHORT} if short else _language_models.DEFAULTS
    return _common.parse_args(argv, __file__, __doc__, defaults, _language_models.QUICK, add_arguments)


def main(argv=None):
    args = parse_args(argv)
    run = _common.start(args)
    with run.scope():
        lm = _language_models.language_model(args)
    tokenizer = lm.tokenizer
    prompt_ids = np.asarray(tokenizer(args.prompt)).tolist()
    if len(prompt_ids) + args.sample_length > args.sequence_length:
        args.parser.error(f"--prompt plus --sample-length must fit in --sequence-length {args.sequence_length}.")

    train_windows = _common.text_windows(
        args, "train", tokenizer, args.sequence_length, args.batch_size, stride=1, shuffle=True
    )
    validation_windows = _common.text_windows(args, "validation", tokenizer, args.sequence_length, args.batch_size)
    if args.validation_batches:
        validation_windows = validation_windows.take(args.validation_batches)
    steps_per_epoch = _common.steps_per_epoch(args, int(train_windows.cardinality()))
    with run.scope():
        _common.compile_task(lm, args, steps_per_epoch, run.jit_compile)
    history = run.fit(
        lm,
        train_windows.map(_language_models.gpt_inputs).repeat(),
        steps_per_epoch,
        validation_data=validation_windows.map(_language_models.gpt_inputs),
    )

    sample = continue_prompt(lm, tokenizer, prompt_ids, args)
    print(f"\nSample ({args.preset}, top-{TOP_K}):\n{sample}\n")

    model_path = run.save(lm)
    reload_check = check_reload(lm, model_path, validation_windows, prompt_ids, sample, args)
    if run.is_chief:
        plot_attention(lm, tokenizer, sample[:ATTENTION_CHARACTERS], run.path("attention.png"))

    validation_loss = history["val_loss"][-1]
    metrics = {
        "validation_loss": validation_loss,
        "validation_perplexity": history["val_perplexity"][-1],
        "validation_bits_per_character": validation_loss / math.log(2),
        "training_loss": history["loss"][-1],
        "parameters": lm.count_params(),
        "sample": sample,
        **reload_check,
    }
    return run.finish({args.preset: history}, metrics, steps_per_epoch)


def continue_prompt(lm, tokenizer, prompt_ids, args):
    """The prompt and `--sample-length` characters after it, top-k sampled with `--seed`."""
    sampler = kzoo.samplers.TopKSampler(k=TOP_K, seed=args.seed)
    # One short call: tracing the loop is quicker than compiling it with XLA.
    token_ids = lm.generate([prompt_ids], max_new_tokens=args.sample_length, sampler=sampler, jit_compile=False)
    return tokenizer.detokenize(token_ids[0])


def plot_attention(lm, tokenizer, text, path):
    """Draws the attention of every head of the last block over `text`."""
    token_ids = np.asarray(tokenizer(text))[None]  # (1, T)
    weights = kzoo.visualization.self_attention_weights(
        lm.backbone, {"token_ids": token_ids, "padding_mask": np.ones_like(token_ids)}
    )  # (1, h, T, T)
    title = f"Self-attention of the last of {lm.backbone.num_layers} blocks (row: where each character looks)"
    kzoo.visualization.plot_attention(weights[0], list(text), path, title=title)


def check_reload(lm, model_path, validation_windows, prompt_ids, sample, args):
    """Reloads the model (and the tokenizer it carries) as a user would; raises unless the logits agree.

    Returns:
        `{"reload_max_abs_logit_difference", "reload_same_sample"}`.
    """
    reloaded = keras.saving.load_model(model_path, compile=False)
    tokenizer = reloaded.tokenizer
    x, _ = _language_models.gpt_inputs(*next(iter(validation_windows)))
    difference = float(np.max(np.abs(lm.predict_on_batch(x) - reloaded.predict_on_batch(x))))
    if difference > 1e-4:
        raise RuntimeError(f"The reloaded model's logits differ from the trained model's by {difference:.3g}.")
    return {
        "reload_max_abs_logit_difference": difference,
        "reload_same_sample": continue_prompt(reloaded, tokenizer, prompt_ids, args) == sample,
    }


if __name__ == "__main__":
    main()
