"""Prompt-lookup decoding (`draft_model=kzoo.models.PromptLookup()`) on a real model, against the
model alone and against transformers' own prompt lookup (`prompt_lookup_num_tokens=`).

Two kinds of prompt, each rendered with the model's chat template: `edit`, code to change and
give back, whose reply copies much of the prompt (what prompt lookup is for), and `write`, code
to write from a sentence, whose reply copies little (what it must not slow down). Every run
makes `--new-tokens` greedy tokens at batch 1 (no stop token); every prompt-lookup output is
checked token for token against the model's own greedy output, in both libraries.

- kzoo: `generate` alone, and with `PromptLookup()` at each `--draft-tokens` (the most tokens
  copied per round); the record gives new tokens/s, the speed-up over `generate` alone and the
  acceptance rate (accepted / proposed copies, `SpeculativeStats`), per kind of prompt.
- transformers (torch, CPU): `generate(do_sample=False)` alone and with
  `prompt_lookup_num_tokens=10` (its documented setting, n-grams of up to 2 tokens), on the
  same prompt ids.

Each library runs in a fresh process of its own, one after the other; within one, the calls
alternate after a warm-up call each (compilation), and each speed is the new tokens of
`--rounds` rounds over their seconds.

    python -m benchmarks.prompt_lookup [--model qwen2.5-coder-1.5b-instruct] [--new-tokens 96]
        [--draft-tokens 4,8] [--rounds 1] [--no-transformers] [--out record.json]
"""

import argparse
import sys

from benchmarks.common import greedy_runs
from benchmarks.common import in_fresh_process
from benchmarks.common import report
from benchmarks.common import wait_for_quiet

CODE = """def merge(a, b):
    result = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            result.append(a[i])
            i += 1
        else:
            result.append(b[j])
            j += 1
    result.extend(a[i:])
    result.extend(b[j:])
    return result
"""
PROMPTS = {
    "edit": (
        "Rename the variable `result` to `merged` in this function and add type hints. Reply with the code only."
        f"\n\n```python\n{CODE}```",
        f"Add a docstring to this function. Reply with the code only.\n\n```python\n{CODE}```",
    ),
    "write": (
        "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces.",
        "Write a Python function that returns the n-th Fibonacci number iteratively.",
    ),
}
# transformers' documented prompt-lookup setting (its `max_matching_ngram_size` left at 2).
TRANSFORMERS_LOOKUP_TOKENS = 10


def kzoo_runs(model_path, prompts, new_tokens, draft_lengths, rounds):
    """kzoo's record per kind of prompt: the prompts' ids, `generate`'s speed alone, and each draft
    length's speed, speed-up and acceptance rate. Raises AssertionError if a prompt-lookup output
    is not the model's own greedy output."""
    import kzoo
    from kzoo.models.decoder import speculative

    lm = kzoo.models.CausalLM.from_preset(model_path)
    chat = lm.tokenizer.apply_chat_template
    lookup = kzoo.models.PromptLookup()
    record = {"lookup": {"max_ngram_size": lookup.max_ngram_size, "min_ngram_size": lookup.min_ngram_size}}
    for kind, texts in prompts.items():
        ids = [chat([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True) for text in texts]
        calls = {"alone": lambda prompt: (lm.generate([prompt], max_new_tokens=new_tokens), None)}
        for k in draft_lengths:
            calls[k] = lambda prompt, k=k: speculative.generate(
                lm, [prompt], draft_model=lookup, draft_tokens=k, max_new_tokens=new_tokens
            )
        seconds, accepted, proposed, outputs, differ = greedy_runs(calls, ids, rounds)
        if differ:
            raise AssertionError(f"{kind}, draft_tokens={differ}: the output is not the model's own greedy output")
        made = new_tokens * len(ids) * rounds
        alone = made / seconds["alone"]
        record[kind] = {
            "prompt_ids": ids,
            "alone_tokens_per_second": alone,
            "prompt_lookup": {
                str(k): {
                    "tokens_per_second": made / seconds[k],
                    "speedup": made / seconds[k] / alone,
                    "acceptance_rate": accepted[k] / max(1, proposed[k]),
                }
                for k in draft_lengths
            },
            "outputs": [outputs[("alone", tuple(p))][0] for p in ids],
        }
    return record


def transformers_runs(model_path, ids_by_kind, new_tokens, rounds):
    """transformers' speeds on the same prompt ids, alone and with its prompt lookup."""
    import torch
    import transformers

    folder, name = model_path.rsplit("/", 1)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # every run makes `new_tokens`, as kzoo's do
    options = dict(do_sample=False, max_new_tokens=new_tokens, pad_token_id=0)
    calls = {"alone": {}, "prompt_lookup": {"prompt_lookup_num_tokens": TRANSFORMERS_LOOKUP_TOKENS}}
    calls = {
        call: lambda prompt, extra=extra: (model.generate(torch.tensor([prompt]), **options, **extra)[0].tolist(), None)
        for call, extra in calls.items()
    }
    record = {}
    with torch.inference_mode():
        for kind, ids in ids_by_kind.items():
            seconds, _, _, outputs, differ = greedy_runs(calls, ids, rounds)
            made = new_tokens * len(ids) * rounds
            record[kind] = {
                "alone_tokens_per_second": made / seconds["alone"],
                "prompt_lookup_tokens_per_second": made / seconds["prompt_lookup"],
                "prompt_lookup_speedup": seconds["alone"] / seconds["prompt_lookup"],
                "outputs": [outputs[("alone", tuple(p))] for p in ids],
                "prompt_lookup_same_tokens": not differ,
            }
    return record


def main():
    from kzoo.checkpoints import fetch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct", help="a name `kzoo.checkpoints.fetch` has")
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--draft-tokens", default="4,8", help="comma-separated draft lengths")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=2, help="how many prompts of each kind")
    parser.add_argument("--no-transformers", action="store_true", help="kzoo alone")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    path = fetch.path(args.model)
    if path is None:
        sys.exit(f"{args.model} is not fetched: python -m kzoo.checkpoints.fetch {args.model}")
    lengths = [int(k) for k in args.draft_tokens.split(",")]
    prompts = {kind: list(texts[: args.prompts]) for kind, texts in PROMPTS.items()}
    wait_for_quiet(limit_seconds=30)
    ours = in_fresh_process(kzoo_runs, str(path), prompts, args.new_tokens, lengths, args.rounds)
    results = {"model": args.model, "new_tokens": args.new_tokens, "rounds": args.rounds, "kzoo": ours}
    if not args.no_transformers:
        wait_for_quiet(limit_seconds=30)
        ids = {kind: ours[kind]["prompt_ids"] for kind in PROMPTS}
        theirs = in_fresh_process(transformers_runs, str(path), ids, args.new_tokens, args.rounds)
        for kind in PROMPTS:
            best = max(ours[kind]["prompt_lookup"].values(), key=lambda run: run["tokens_per_second"])
            theirs[kind]["kzoo_prompt_lookup_over_transformers_prompt_lookup"] = (
                best["tokens_per_second"] / theirs[kind]["prompt_lookup_tokens_per_second"]
            )
            theirs[kind]["same_greedy_tokens_as_kzoo"] = [
                a == b for a, b in zip(theirs[kind].pop("outputs"), ours[kind]["outputs"])
            ]
        results["transformers"] = theirs
    report("prompt_lookup", results, args.out)


if __name__ == "__main__":
    main()
