"""llama.cpp on a GGUF file: decode and prefill tokens/s, its greedy chat reply, its greedy tokens.

The CPU anchor of kzoo's benchmarks (issues 30 and 32): llama.cpp through `llama-cpp-python`,
built from source on this host. Run it with the llama.cpp virtual environment's python, never
kzoo's (README.md here says how to build that environment); it imports nothing from kzoo.

- Speed (`--repeats` runs, each on a cleared cache): a `--prompt-tokens` prompt (the tokens of
  `speed_prompt.TEXT`, cut to length) evaluated as one batch, then `--new-tokens` greedy
  tokens one at a time, end-of-generation tokens ignored so every run decodes as many. The
  rates are llama.cpp's own counters (`llama_perf_context`: prompt batches and single-token
  batches timed apart), so the prefill and the decode are separate numbers and Python's loop
  around them is left out; the wall-clock rates with the loop are recorded beside them.
- `--chat TEXT`: llama.cpp's reply to one user message, rendered with the file's chat template
  by `create_chat_completion`, greedy (temperature 0), up to `--chat-tokens` tokens.
- `--greedy-ids 1,2,3`: the `--greedy-tokens` ids llama.cpp's greedy decoding (argmax of the
  logits) appends to those prompt ids, without stopping at end tokens: what kzoo's
  `CausalLM.generate(prompt_ids, max_new_tokens=N)` returns, to compare.

    /work/peers/llama_cpp/bin/python benchmarks/peers/llama_cpp_bench.py MODEL.gguf [--threads 2] \
        [--n-ctx 2048] [--prompt-tokens 256] [--new-tokens 128] [--repeats 3] \
        [--chat "What is the capital of France? Answer in one sentence."] \
        [--greedy-ids 1,9690,198 --greedy-tokens 32] [--json FILE]

Prints one JSON record (and writes it to `--json`).
"""

import argparse
import importlib.metadata
import json
import os
import statistics
import time
from pathlib import Path

import llama_cpp
import numpy as np
from speed_prompt import text_of_at_least  # this folder: the script's own path


def load(path, threads, n_ctx):
    start = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=n_ctx, n_batch=512, n_threads=threads, n_threads_batch=threads, verbose=False
    )
    return llm, time.perf_counter() - start


def last_logits(llm):
    return np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),))


def greedy(llm, prompt_ids, new_tokens, reset_perf=False):
    """Evaluates the prompt as one batch, then `new_tokens` argmax tokens one at a time (no
    stopping): `(new ids, wall seconds of the prompt, wall seconds of the decode)`."""
    llm.reset()
    llm._ctx.kv_cache_clear()
    if reset_perf:
        llama_cpp.llama_perf_context_reset(llm.ctx)
    start = time.perf_counter()
    llm.eval(prompt_ids)
    prompt_seconds = time.perf_counter() - start
    ids = [int(np.argmax(last_logits(llm)))]
    start = time.perf_counter()
    while len(ids) < new_tokens:
        llm.eval(ids[-1:])
        ids.append(int(np.argmax(last_logits(llm))))
    # The last id's own step is timed too, so the decode counts `new_tokens` steps; llama.cpp
    # counts a step when it waits for it, which fetching the logits does, and so does this.
    llm.eval(ids[-1:])
    llama_cpp.llama_synchronize(llm.ctx)
    return ids, prompt_seconds, time.perf_counter() - start


def speed(llm, prompt_tokens, new_tokens, repeats):
    ids = llm.tokenize(text_of_at_least(prompt_tokens).encode(), add_bos=False)
    if len(ids) < prompt_tokens:
        raise SystemExit(f"the speed text gives {len(ids)} tokens, fewer than --prompt-tokens {prompt_tokens}")
    prompt = ids[:prompt_tokens]
    greedy(llm, prompt[:16], 4)  # warm-up
    runs = []
    for _ in range(repeats):
        load_average = os.getloadavg()
        _, prompt_seconds, decode_seconds = greedy(llm, prompt, new_tokens, reset_perf=True)
        perf = llama_cpp.llama_perf_context(llm.ctx)
        if perf.n_p_eval != prompt_tokens or perf.n_eval != new_tokens:
            raise SystemExit(f"llama.cpp counted {perf.n_p_eval} prompt and {perf.n_eval} decode tokens")
        runs.append(
            {
                "prefill_tokens_per_second": 1000 * perf.n_p_eval / perf.t_p_eval_ms,
                "decode_tokens_per_second": 1000 * perf.n_eval / perf.t_eval_ms,
                "wall_prefill_tokens_per_second": prompt_tokens / prompt_seconds,
                "wall_decode_tokens_per_second": new_tokens / decode_seconds,
                "load_average": load_average,
            }
        )
    median = {key: statistics.median(run[key] for run in runs) for key in runs[0] if key != "load_average"}
    return {"prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "median": median, "runs": runs}


def chat(llm, text, max_tokens):
    result = llm.create_chat_completion(
        [{"role": "user", "content": text}], temperature=0.0, top_k=1, repeat_penalty=1.0, max_tokens=max_tokens
    )
    return {
        "message": text,
        "reply": result["choices"][0]["message"]["content"],
        "finish_reason": result["choices"][0]["finish_reason"],
        "usage": result["usage"],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n-ctx", type=int, default=2048)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="speed runs; 0 skips the speed")
    parser.add_argument("--chat", help="a user message to answer")
    parser.add_argument("--chat-tokens", type=int, default=64)
    parser.add_argument("--greedy-ids", help="comma-separated prompt ids")
    parser.add_argument("--greedy-tokens", type=int, default=32)
    parser.add_argument("--json")
    args = parser.parse_args()
    path = Path(args.gguf)
    if not path.is_file():
        parser.error(f"no GGUF file at {path}")
    if args.prompt_tokens + args.new_tokens > args.n_ctx:
        parser.error(f"--prompt-tokens + --new-tokens must fit in --n-ctx {args.n_ctx}")
    llm, load_seconds = load(path, args.threads, args.n_ctx)
    record = {
        "peer": "llama.cpp",
        "versions": {"llama-cpp-python": importlib.metadata.version("llama-cpp-python")},
        "system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "gguf": str(path.resolve()),
        "file_bytes": path.stat().st_size,
        "file_type": llm.metadata.get("general.file_type"),
        "threads": args.threads,
        "n_ctx": args.n_ctx,
        "load_seconds": load_seconds,
    }
    if args.repeats:
        record["speed"] = speed(llm, args.prompt_tokens, args.new_tokens, args.repeats)
    if args.chat:
        record["chat"] = chat(llm, args.chat, args.chat_tokens)
    if args.greedy_ids:
        prompt = [int(token) for token in args.greedy_ids.split(",")]
        ids, _, _ = greedy(llm, prompt, args.greedy_tokens)
        record["greedy"] = {"prompt_ids": prompt, "new_ids": ids, "text": llm.detokenize(ids).decode(errors="replace")}
    text = json.dumps(record, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
