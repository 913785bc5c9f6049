"""kzoo's peers in its benchmarks: litert-torch's bundles and llama.cpp, each from its own
virtual environment, and the one LiteRT-LM measurement every bundle gets.

The peers are never kzoo dependencies. `litert_torch_export.py` and `llama_cpp_bench.py` run with
their environments' python (README.md here says how to build them) in child processes and answer
in JSON; `litert_torch_export` and `llama_cpp_bench` below call them. What runs in kzoo's own
environment is here too: a bundle's speed in LiteRT-LM (`runtime_speed`, the same call for
kzoo's bundles and the peer's), its sections and metadata, and its greedy chat reply.

    from benchmarks import peers
    exported = peers.litert_torch_export("smollm2_hf", "peer_bundles")
    bundles = {"kzoo int8": "export/model_int8.litertlm",
               "litert-torch int8": exported["bundles"]["int8"]["path"]}
    speeds = peers.interleaved_speeds(bundles, repeats=3)
    anchor = peers.llama_cpp_bench("SmolLM2-135M-Instruct.Q4_1.gguf", "--repeats", 3)
"""

import json
import os
import statistics
import subprocess
from pathlib import Path

from benchmarks.peers.speed_prompt import text_of_at_least

FOLDER = Path(__file__).resolve().parent

# Each peer's python; the environment variable overrides the place README.md builds it in.
PYTHONS = {
    "litert_torch": os.environ.get("KZOO_LITERT_TORCH_PYTHON", "/work/peers/litert_torch/bin/python"),
    "llama_cpp": os.environ.get("KZOO_LLAMA_CPP_PYTHON", "/work/peers/llama_cpp/bin/python"),
}


def run_peer(peer, script, *args):
    """Runs `script` (a file of this folder) with `peer`'s python; returns the JSON it prints."""
    python = PYTHONS[peer]
    if not Path(python).is_file():
        variable = f"KZOO_{peer.upper()}_PYTHON"
        raise FileNotFoundError(
            f"No python for {peer} at {python}: build its environment (benchmarks/peers/README.md) or set {variable}."
        )
    result = subprocess.run([python, str(FOLDER / script), *map(str, args)], capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"{script} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads(result.stdout)


def litert_torch_export(
    folder, out, precisions=("fp32", "int8", "int4"), cache_length=2048, prefill_lengths=(16, 64, 256)
):
    """litert-torch's bundles of the Hugging Face `folder` in `out`, with their export times,
    peak memory and sizes (see litert_torch_export.py); `["bundles"][precision]["path"]`."""
    return run_peer(
        "litert_torch",
        "litert_torch_export.py",
        folder,
        "--out",
        out,
        "--precisions",
        ",".join(precisions),
        "--cache-length",
        cache_length,
        "--prefill-lengths",
        ",".join(map(str, prefill_lengths)),
    )


def llama_cpp_bench(gguf, *options):
    """llama.cpp's speed, chat reply or greedy ids on `gguf` (options as in llama_cpp_bench.py)."""
    return run_peer("llama_cpp", "llama_cpp_bench.py", gguf, *options)


def runtime_speed(path, prompt_tokens=256, new_tokens=128, threads=2):
    """One run of LiteRT-LM's own benchmark on a bundle, on `threads` CPU threads.

    The runtime loads the bundle (no weight cache), prefills `prompt_tokens` tokens of
    `speed_prompt.TEXT` (cut by its own tokenizer) and decodes `new_tokens` tokens, stop tokens
    ignored, so every bundle runs the same number of steps whatever its metadata says. The rates
    are the runtime's own timings (`BenchmarkInfo`).
    """
    import litert_lm

    litert_lm.set_min_log_severity(litert_lm.LogSeverity.ERROR)
    load_average = os.getloadavg()
    info = litert_lm.Benchmark(
        model_path=str(path),
        backend=litert_lm.Backend.CPU(thread_count=threads),
        prefill_tokens=prompt_tokens,
        decode_tokens=new_tokens,
        cache_dir=":nocache",
        prompt=text_of_at_least(prompt_tokens),
    ).run()
    counted = (info.last_prefill_token_count, info.last_decode_token_count)
    if counted != (prompt_tokens, new_tokens):
        raise RuntimeError(
            f"LiteRT-LM ran {counted} prefill and decode tokens of {path}, not {prompt_tokens, new_tokens}"
        )
    return {
        "prefill_tokens_per_second": info.last_prefill_tokens_per_second,
        "decode_tokens_per_second": info.last_decode_tokens_per_second,
        "time_to_first_token_seconds": info.time_to_first_token_in_second,
        "load_seconds": info.init_time_in_second,
        "load_average": load_average,
    }


def interleaved_speeds(bundles, repeats=3, **options):
    """`{name: {"median": {...}, "runs": [...]}}` of `runtime_speed` for each bundle of
    `{name: path}`: `repeats` rounds, each bundle once a round, so a drift of the host's speed
    reaches every bundle alike."""
    runs = {name: [] for name in bundles}
    for _ in range(repeats):
        for name, path in bundles.items():
            runs[name].append(runtime_speed(path, **options))
    return {
        name: {
            "median": {key: statistics.median(run[key] for run in rows) for key in rows[0] if key != "load_average"},
            "runs": rows,
        }
        for name, rows in runs.items()
    }


def bundle_contents(path):
    """What a `.litertlm` holds: its sections (type and bytes) and the LlmMetadata the runtime
    reads (maximum tokens, start and stop tokens, whether a chat template is there)."""
    from google.protobuf import text_format

    from kzoo.export import litertlm_model

    found = litertlm_model.read_sections(path)
    sections = [
        {"type": data_type, "model": model_type, "bytes": end - begin} for data_type, model_type, begin, end in found
    ]
    ((model_begin, model_end),) = [(begin, end) for data_type, _, begin, end in found if data_type == "TFLiteModel"]
    metadata = litertlm_model.read_metadata(path)

    def token(union):
        return list(union.token_ids.ids) if union.HasField("token_ids") else union.token_str

    return {
        "file_bytes": Path(path).stat().st_size,
        "sections": sections,
        "looked_up_bytes": _looked_up_bytes_of(path, model_begin, model_end),
        "max_num_tokens": metadata.max_num_tokens,
        "start_token": token(metadata.start_token) if metadata.HasField("start_token") else None,
        "stop_tokens": [token(union) for union in metadata.stop_tokens],
        "chat_template": metadata.jinja_prompt_template or None,
        "model_type": text_format.MessageToString(metadata.llm_model_type, as_one_line=True),
    }


def _looked_up_bytes_of(path, begin, end):
    """`looked_up_bytes` of the TFLite model at bytes `begin:end` of the bundle `path`, read
    through a mapping (1.5 GB at 1.5B)."""
    import mmap

    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)[begin:end]
        try:
            return looked_up_bytes(view)
        finally:
            view.release()


def looked_up_bytes(tflite_model):
    """Bytes of the TFLite model's tables that are only looked up (the table input of an
    EMBEDDING_LOOKUP that no other op reads): a decode step reads one row of such a table, not
    all of it. An untied token table is one (Qwen2.5-Coder-1.5B's, 233 MB of its int4 bundle);
    a tied one is also the output layer's weights and is read whole."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.Model.GetRootAs(tflite_model, 0)
    codes = [model.OperatorCodes(i) for i in range(model.OperatorCodesLength())]
    embedding_lookup = schema.BuiltinOperator.EMBEDDING_LOOKUP
    lookup = {
        i for i, code in enumerate(codes) if max(code.BuiltinCode(), code.DeprecatedBuiltinCode()) == embedding_lookup
    }
    tables, read_otherwise = set(), set()
    for g in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(g)
        for o in range(subgraph.OperatorsLength()):
            op = subgraph.Operators(o)
            buffers = [subgraph.Tensors(int(i)).Buffer() if i >= 0 else None for i in op.InputsAsNumpy()]
            if op.OpcodeIndex() in lookup:
                tables.add(buffers[1])
                read_otherwise.update(buffers[:1] + buffers[2:])
            else:
                read_otherwise.update(buffers)
    # A buffer's bytes: inline data, or (a model past 2 GB) its size after the flatbuffer.
    return sum(model.Buffers(b).DataLength() or model.Buffers(b).Size() for b in tables - read_otherwise)


def chat_reply(path, prompt, max_new_tokens=64, threads=2):
    """The bundle's greedy reply in LiteRT-LM to a rendered chat `prompt` (the text transformers'
    `apply_chat_template(..., add_generation_prompt=True)` gives, its start token included):
    `{"reply", "prompt_ids"}`, the reply ending at the bundle's stop tokens.

    The prompt goes to the runtime as text, without the runtime's own template: LiteRT-LM 0.18.1
    hands a template each message's content as a list of parts, which a Hugging Face template that
    adds strings to `message['content']` (SmolLM2's) cannot render. When the bundle names a start
    token, the runtime puts it first itself, so the prompt's own is dropped; `prompt_ids` are the
    ids the runtime prefills, to compare with the tokenizer's.
    """
    import litert_lm

    litert_lm.set_min_log_severity(litert_lm.LogSeverity.ERROR)
    with litert_lm.Engine(
        str(path), backend=litert_lm.Backend.CPU(thread_count=threads), cache_dir=":nocache"
    ) as engine:
        start = engine.bos_token_id
        text = prompt
        if start is not None and prompt.startswith(engine.detokenize([start])):
            text = prompt[len(engine.detokenize([start])) :]
        prompt_ids = ([] if start is None else [start]) + engine.tokenize(text)
        greedy = litert_lm.SamplerConfig(top_k=1)
        with engine.create_session(
            apply_prompt_template=False, sampler_config=greedy, max_output_tokens=max_new_tokens
        ) as session:
            session.run_prefill([text])
            reply = "".join("".join(response.texts) for response in session.run_decode_async())
    return {"reply": reply, "prompt_ids": prompt_ids}
