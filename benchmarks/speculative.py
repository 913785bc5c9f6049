"""Speculative decoding on a real pair: Qwen2.5-Coder-0.5B-Instruct drafting for the 1.5B.

Both GGUF files come from `kzoo.checkpoints.fetch` (float32 weights once loaded). Each code
prompt is rendered with the chat template, and every library generates `--new-tokens` greedy
tokens after it at batch 1 (no stop token, so every run makes the same number):

- kzoo: the target's compiled `generate` alone, and with `draft_model=` at each `--draft-tokens`;
  every speculative output is checked token-for-token against the target's own. The record
  gives new tokens/s, the speed-up over the target alone and the acceptance rate (accepted /
  proposed draft tokens, `SpeculativeStats`).
- kzoo's compiled decode step (`step_ms`): the target's at 1 and at k + 1 positions, the draft's
  at 1, which is what a round costs.
- the floor (`floor`): the target's weights read once per token at the bandwidth every core reads
  (`benchmarks.common.weight_floor`; the untied token table is only looked up), the best of the
  meter's readings before and after the runs (the host's rate moves between minutes),
  over which the target alone's new tokens/s (its prefill included, as `benchmarks.llm` counts)
  and its 1-position step are given as fractions; transformers alone over the same floor too.
- with `--bfloat16-target`, also the target loaded in bfloat16 checking the same drafts in
  TensorFlow's graph, the draft's calls compiled with XLA (`jit_compile="draft"`), where
  oneDNN's bfloat16 product (AMX where the CPU has it) reads a weight once for every
  position checked (`speculative_bfloat16_target`, and its check's step in `step_ms`). Its
  outputs are compared with its own greedy output, not required equal: bfloat16 rounds a
  check of k + 1 positions otherwise than a step of one, so a near-tie may go either way
  (`first_difference_from_own`: per prompt, the first new token that differs, or None).
- transformers (torch, CPU): the target's `generate(do_sample=False)` alone and with
  `assistant_model=` (its assisted generation, default schedule), on the same prompt ids.

Under `KERAS_BACKEND=jax` kzoo's runs are JAX's (`--bfloat16-target`, TensorFlow's graph, is
refused there). Each library runs in a fresh process of its own, one after the other (together
they would not fit beside each other in memory at 1.5B); within one, the calls alternate after a
warm-up call each (compilation), and each speed is the new tokens of `--rounds` rounds over
their seconds.

    python -m benchmarks.speculative [--new-tokens 128] [--draft-tokens 3,4,6] [--rounds 2] [--bfloat16-target]
        [--out record.json]
"""

import argparse
import sys

from benchmarks.common import bandwidth_meter
from benchmarks.common import greedy_runs
from benchmarks.common import in_fresh_process
from benchmarks.common import report
from benchmarks.common import wait_for_quiet
from benchmarks.common import weight_floor

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
# The floor's meter reads 2 GiB, 64x these hosts' 32 MB last-level cache: a larger array reads at
# the same rate, and an array of the target's 6.2 GB would not fit beside both models.
METER_BYTES = 2**31
PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces.",
)


def kzoo_runs(target_path, draft_path, prompts, new_tokens, draft_lengths, rounds, bfloat16_target=False):
    """kzoo's record: the prompts' ids, the target's speed alone, each draft length's speed, speed-up
    and acceptance rate (`speculative`, and `speculative_bfloat16_target` where asked), the step
    costs (`step_ms`), and the greedy outputs and replies. Raises AssertionError if a float32
    speculative output is not the target's own."""
    import kzoo
    from kzoo.models.decoder import speculative

    target = kzoo.models.CausalLM.from_preset(target_path)
    draft = kzoo.models.CausalLM.from_preset(draft_path)
    chat = target.tokenizer.apply_chat_template
    ids = [chat([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True) for p in prompts]
    calls = {"alone": lambda prompt: (target.generate([prompt], max_new_tokens=new_tokens), None)}
    for k in draft_lengths:
        calls[k] = lambda prompt, k=k: speculative.generate(
            target, [prompt], draft_model=draft, draft_tokens=k, max_new_tokens=new_tokens
        )
    half = kzoo.models.CausalLM.from_preset(target_path, dtype="bfloat16") if bfloat16_target else None
    for k in draft_lengths if half else ():
        calls[f"bfloat16_{k}"] = lambda prompt, k=k: speculative.generate(
            half, [prompt], draft_model=draft, draft_tokens=k, max_new_tokens=new_tokens, jit_compile="draft"
        )
    meter = bandwidth_meter(METER_BYTES)
    bandwidths = [meter()]
    seconds, accepted, proposed, outputs, differ = greedy_runs(calls, ids, rounds)
    if half:  # compared with the bfloat16 target's own greedy output below, not required equal
        own = {tuple(p): half.generate([p], max_new_tokens=new_tokens, jit_compile=False) for p in ids}
        differ = [name for name in differ if not str(name).startswith("bfloat16_")]
    if differ:
        raise AssertionError(f"draft_tokens={differ}: the speculative output is not the target's greedy output")
    alone = new_tokens * len(ids) * rounds / seconds["alone"]
    record = {"prompt_ids": ids, "alone_tokens_per_second": alone}
    groups = {"speculative": ""} | ({"speculative_bfloat16_target": "bfloat16_"} if half else {})
    for group, prefix in groups.items():
        record[group] = {}
        for k in draft_lengths:
            name = f"{prefix}{k}" if prefix else k
            speed = new_tokens * len(ids) * rounds / seconds[name]
            record[group][str(k)] = {
                "tokens_per_second": speed,
                "speedup": speed / alone,
                "acceptance_rate": accepted[name] / max(1, proposed[name]),
            }
    if half:
        record["bfloat16_target_same_tokens_as_float32"] = [own[tuple(p)] == outputs[("alone", tuple(p))] for p in ids]
        for k in draft_lengths:
            record["speculative_bfloat16_target"][str(k)]["first_difference_from_own"] = [
                first_difference(outputs[(f"bfloat16_{k}", tuple(p))][0][len(p) :], own[tuple(p)][0][len(p) :])
                for p in ids
            ]
    record["step_ms"] = step_times(target, draft, max(draft_lengths) + 1, half)
    bandwidths.append(meter())
    floor_seconds, read = weight_floor(target, bandwidth=max(bandwidths))
    record["floor"] = {
        "bytes_per_token": read,
        "bandwidth_readings_gb_per_second": [b / 1e9 for b in bandwidths],
        "bandwidth_gb_per_second": max(bandwidths) / 1e9,
        "tokens_per_second": 1 / floor_seconds,
        "alone_over_floor": alone * floor_seconds,
        "step_over_floor": 1000 * floor_seconds / record["step_ms"]["target_1"],
    }
    record["outputs"] = [outputs[("alone", tuple(p))][0] for p in ids]
    record["replies"] = [target.tokenizer.detokenize(tokens[len(p) :]) for tokens, p in zip(record["outputs"], ids)]
    return record


def first_difference(tokens, reference):
    """The first index where two token lists differ (None where they are equal).

    >>> first_difference([1, 2, 3], [1, 5, 3]), first_difference([1, 2], [1, 2])
    (1, None)
    """
    if tokens == reference:
        return None
    return next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), min(len(tokens), len(reference)))


def step_times(target, draft, tokens, bfloat16_target=None, repeats=5):
    """Median ms of one compiled `decode` call at position 64 of a 256-slot cache: the target's
    at 1 and at `tokens` positions (what checking a draft costs), the draft's at 1, and where
    given the bfloat16 target's at `tokens` positions in TensorFlow's graph. A round of k
    proposals costs k draft steps and one target step of k + 1 positions. Compiled as `generate`
    compiles (`generation.compile_function`), under whichever Keras backend runs."""
    import numpy as np
    from keras import ops

    from benchmarks.common import median_time
    from kzoo.models import generation

    times = {}
    steps = [("target_1", target, 1, True), (f"target_{tokens}", target, tokens, True), ("draft_1", draft, 1, True)]
    if bfloat16_target is not None:
        steps.append((f"bfloat16_target_graph_{tokens}", bfloat16_target, tokens, False))
    for name, lm, count, xla in steps:
        ids = np.full([1, count], 7, "int32")
        _, state = lm.prefill(np.full([1, 64], 7, "int32"), 256)
        step = generation.compile_function(lambda t, s, lm=lm: lm.decode(t, s, 64, last_only=False)[0], xla, (lm,))
        step(ids, state)
        times[name] = 1000 * median_time(lambda: ops.convert_to_numpy(step(ids, state)), repeats)
    return times


def transformers_runs(target_path, draft_path, ids, new_tokens, rounds):
    """transformers' speeds on the same prompt ids, alone and with `assistant_model=`."""
    import torch
    import transformers

    def load(path):
        folder, name = path.rsplit("/", 1)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        return model.eval()

    target, draft = load(target_path), load(draft_path)
    for model in (target, draft):  # no stop token, as in kzoo's runs: every run makes `new_tokens`
        model.generation_config.eos_token_id = None
    options = dict(do_sample=False, max_new_tokens=new_tokens, pad_token_id=0)
    calls = {"alone": {}, "assisted": {"assistant_model": draft}}
    calls = {
        name: lambda prompt, extra=extra: (
            target.generate(torch.tensor([prompt]), **options, **extra)[0].tolist(),
            None,
        )
        for name, extra in calls.items()
    }
    with torch.inference_mode():
        seconds, _, _, outputs, differ = greedy_runs(calls, ids, rounds)
    speeds = {name: new_tokens * len(ids) * rounds / value for name, value in seconds.items()}
    return {
        "alone_tokens_per_second": speeds["alone"],
        "assisted_tokens_per_second": speeds["assisted"],
        "assisted_speedup": speeds["assisted"] / speeds["alone"],
        "outputs": [outputs[("alone", tuple(p))] for p in ids],
        "assisted_same_tokens": not differ,
    }


def main():
    from kzoo.checkpoints import fetch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--draft-tokens", default="3,4,6", help="comma-separated draft lengths")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help="how many of the code prompts")
    parser.add_argument("--no-transformers", action="store_true", help="kzoo alone")
    parser.add_argument("--bfloat16-target", action="store_true", help='also a bfloat16 target (jit_compile="draft")')
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    paths = {name: fetch.path(name) for name in (TARGET, DRAFT)}
    for name, path in paths.items():
        if path is None:
            sys.exit(f"{name} is not fetched: python -m kzoo.checkpoints.fetch {name}")
    lengths = [int(k) for k in args.draft_tokens.split(",")]
    prompts = list(PROMPTS[: args.prompts])
    wait_for_quiet(limit_seconds=30)
    ours = in_fresh_process(
        kzoo_runs,
        str(paths[TARGET]),
        str(paths[DRAFT]),
        prompts,
        args.new_tokens,
        lengths,
        args.rounds,
        args.bfloat16_target,
    )
    results = {"target": TARGET, "draft": DRAFT, "new_tokens": args.new_tokens, "rounds": args.rounds, "kzoo": ours}
    if not args.no_transformers:
        wait_for_quiet(limit_seconds=30)
        theirs = in_fresh_process(
            transformers_runs, str(paths[TARGET]), str(paths[DRAFT]), ours["prompt_ids"], args.new_tokens, args.rounds
        )
        runs = [*ours["speculative"].values(), *ours.get("speculative_bfloat16_target", {}).values()]
        best = max(runs, key=lambda run: run["tokens_per_second"])
        results["transformers"] = theirs
        results["kzoo_speculative_over_transformers_assisted"] = (
            best["tokens_per_second"] / theirs["assisted_tokens_per_second"]
        )
        results["kzoo_alone_over_transformers_alone"] = (
            ours["alone_tokens_per_second"] / theirs["alone_tokens_per_second"]
        )
        # The same weights read per token, so kzoo's floor (measured in its own process) is theirs.
        theirs["alone_over_floor"] = theirs["alone_tokens_per_second"] / ours["floor"]["tokens_per_second"]
        results["same_greedy_tokens_as_transformers"] = [a == b for a, b in zip(theirs.pop("outputs"), ours["outputs"])]
    report("speculative", results, args.out)


if __name__ == "__main__":
    main()
