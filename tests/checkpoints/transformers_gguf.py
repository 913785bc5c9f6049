"""transformers' reading of a GGUF file, run in a process of its own so that its float32 copy of
the weights is gone before kzoo loads the same file (a 1.5B model holds 7 GB in each).

    python -m tests.checkpoints.transformers_gguf MODEL.gguf OUT.npz PROMPTS.json

PROMPTS.json holds {"chats": [text, ...], "texts": [text, ...], "new_tokens": n}. For each chat
text, rendered as one user message through the file's chat template when it has one (else the
text as is), OUT.npz holds the prompt's ids (`ids_<i>`), the last position's float32 logits
(`logits_<i>`) and the greedy continuation of n tokens (`greedy_<i>`, up to the end of turn or
text); for each text, transformers' token ids (`tokens_<i>`); the rendered prompts in `rendered`.
"""

import json
import sys

import numpy as np
import torch
import transformers


def main(path, out, prompts):
    folder, name = path.rsplit("/", 1)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    prompts = json.loads(open(prompts, encoding="utf-8").read())
    stops = [model.generation_config.eos_token_id or []]
    stops = [i for i in np.ravel(stops).tolist() if i is not None]
    if tokenizer.chat_template:
        stops.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    results, rendered = {}, []
    for i, text in enumerate(prompts["chats"]):
        if tokenizer.chat_template:
            message = [{"role": "user", "content": text}]
            text = tokenizer.apply_chat_template(message, tokenize=False, add_generation_prompt=True)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            ids = tokenizer(text)["input_ids"]
        rendered.append(text)
        with torch.no_grad():
            inputs = torch.tensor([ids])
            results[f"logits_{i}"] = model(input_ids=inputs).logits[0, -1].numpy()
            output = model.generate(
                inputs, max_new_tokens=prompts["new_tokens"], do_sample=False, eos_token_id=stops, pad_token_id=stops[0]
            )[0, len(ids) :].tolist()
        results[f"ids_{i}"] = np.array(ids)
        results[f"greedy_{i}"] = np.array(output)
    for i, text in enumerate(prompts["texts"]):
        results[f"tokens_{i}"] = np.array(tokenizer(text, add_special_tokens=False)["input_ids"])
    np.savez(out, rendered=np.array(rendered), stops=np.array(stops), **results)


if __name__ == "__main__":
    main(*sys.argv[1:])
