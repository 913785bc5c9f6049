"""kzoo's GGUF files in llama.cpp: greedy tokens against Keras' on the same file (issue 32, once,
outside the test suite).

For each `--file-types` type, SmolLM2-135M-Instruct (the `smollm2_135m_instruct` preset) is
written with `CausalLM.export_to_gguf`, and for each prompt the `--new-tokens` greedy ids are
compared, no stop tokens, between:

- llama.cpp on the file (`llama_cpp_bench.py --greedy-ids`, in the llama.cpp environment);
- Keras on the same file read back (`CausalLM.from_preset(file)`: the weights llama.cpp reads);
- Keras on the preset itself (for F16 and Q8_0, weights rounded once more by the file).

The prompts: the chat prompt (the template's rendering of one user message) and two plain ones.

    python -m benchmarks.peers.gguf_llama_cpp [--file-types F32,F16,Q8_0] [--new-tokens 32] [--out gguf.json]
"""

import argparse
import os
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import kzoo  # noqa: E402
from benchmarks import peers  # noqa: E402
from benchmarks.common import report  # noqa: E402
from kzoo.tokenizers import packing  # noqa: E402

CHAT = "What is the capital of France? Answer in one sentence."
PLAIN = ["The three primary colors are", "def fibonacci(n):\n"]


def prompts(lm):
    messages = [{"role": "user", "content": CHAT}]
    chat = lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return {
        "chat": [int(token) for token in chat],
        **{text: packing.prompt_ids(lm.tokenizer, text) for text in PLAIN},
    }


def keras_greedy(lm, prompt_ids, new_tokens):
    return lm.generate([prompt_ids], max_new_tokens=new_tokens)[0][len(prompt_ids) :]


def compare(file_type, folder, lm, prompt_ids, new_tokens):
    path = Path(folder) / f"smollm2_{file_type}.gguf"
    lm.export_to_gguf(path, file_type=file_type)
    same_file = kzoo.models.CausalLM.from_preset(str(path))
    cases = {}
    for name, ids in prompt_ids.items():
        llama = peers.llama_cpp_bench(
            path, "--repeats", 0, "--greedy-ids", ",".join(map(str, ids)), "--greedy-tokens", new_tokens
        )["greedy"]
        keras_file = [int(token) for token in keras_greedy(same_file, ids, new_tokens)]
        keras_preset = [int(token) for token in keras_greedy(lm, ids, new_tokens)]
        cases[name] = {
            "prompt_tokens": len(ids),
            "llama_cpp": llama["new_ids"],
            "llama_cpp_text": llama["text"],
            "keras_same_file": keras_file,
            "keras_preset": keras_preset,
            "equal_to_keras_same_file": llama["new_ids"] == keras_file,
            "equal_to_keras_preset": llama["new_ids"] == keras_preset,
            "first_difference_same_file": first_difference(llama["new_ids"], keras_file),
        }
    return {"file_bytes": path.stat().st_size, "prompts": cases}


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file-types", default="F32,F16,Q8_0")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--out")
    args = parser.parse_args()
    lm = kzoo.models.CausalLM.from_preset("smollm2_135m_instruct")
    prompt_ids = prompts(lm)
    with tempfile.TemporaryDirectory() as folder:
        results = {
            "new_tokens": args.new_tokens,
            "file_types": {
                file_type: compare(file_type, folder, lm, prompt_ids, args.new_tokens)
                for file_type in args.file_types.split(",")
            },
        }
    return report("gguf_in_llama_cpp", results, args.out)


if __name__ == "__main__":
    main()
