"""Generates text from a kzoo `.litertlm` bundle in Google's LiteRT-LM runtime, streaming it.

    python export/serve_litertlm.py DIR/model.litertlm --prompt "ROMEO:"
        [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S] [--greedy]
    python export/serve_litertlm.py DIR/model.litertlm --chat [--system TEXT] [the same options]

Prints the prompt, then the text as the runtime produces it. With `--chat` (a bundle of a chat
model, which carries its chat template), each line read from stdin is a user's message: the
runtime renders the conversation so far with the template and streams the assistant's reply,
to its end-of-turn token, on a line of its own; `--max-new-tokens` bounds each reply. Every
flag is checked first every flag is checked first
(exit status 2 and the flag's range for one out of range). The bundle carries its tokenizer
and its default sampler (kzoo's: top-k, k = 5); the flags override the sampler, `--greedy`
takes the most likely token each time (the text Keras' greedy `generate` gives). A
translation bundle (`recipes/gpt_translate.py`'s model) takes its prompt as `english [SEP]`,
e.g. `--prompt "How are you? [SEP]" --greedy`, and stops at [EOS]. Exits with
status 1 and a message for a file that is not a bundle or is truncated, an empty prompt, or a
prompt, conversation or `--max-new-tokens` that does not fit in the bundle's maximum number of
tokens, or `--chat` with a bundle without a chat template.

The runner, `kzoo/export/litertlm_model.py`, is loaded by its path: importing the `kzoo`
package would import TensorFlow; this needs only the `litert-lm-api` and `litert-lm-builder`
packages (`pip install 'kzoo[litertlm]'`).
"""

import argparse
import importlib.util
import sys
from pathlib import Path


def load_runner():
    """`kzoo.export.litertlm_model`, from beside this file or from the kzoo repository."""
    here = Path(__file__).resolve().parent
    for path in (here / "litertlm_model.py", here.parent / "kzoo" / "export" / "litertlm_model.py"):
        if path.is_file():
            spec = importlib.util.spec_from_file_location("litertlm_model", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    raise SystemExit("litertlm_model.py not found: copy kzoo/export/litertlm_model.py beside this script.")


def option(runner, name, parse):
    """An argparse type: `parse`, then the runner's range check of the option `name`."""

    def checked(text):
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be {'an integer' if parse is int else 'a number'}; received {text!r}"
            )
        problem = runner.option_problem(name, value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    return checked


def main(argv=None):
    runner = load_runner()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", help="a .litertlm file written by export/export.py")
    task = parser.add_mutually_exclusive_group(required=True)
    task.add_argument("--prompt", help="the text to continue")
    task.add_argument("--chat", action="store_true", help="a conversation: one user message per line of stdin")
    parser.add_argument("--system", help="with --chat: the system message that starts the conversation")
    parser.add_argument("--max-new-tokens", type=int, help="the most tokens to generate (default: all that fit)")
    parser.add_argument(
        "--temperature", type=option(runner, "temperature", float), help="sampling temperature (default: the bundle's)"
    )
    parser.add_argument(
        "--top-k",
        type=option(runner, "top_k", int),
        help="sample among the k most likely tokens (default: the bundle's)",
    )
    parser.add_argument(
        "--top-p",
        type=option(runner, "top_p", float),
        help="sample among the most likely tokens of total probability p",
    )
    parser.add_argument(
        "--seed", type=option(runner, "seed", int), help="the sampler's seed: the same seed repeats the text"
    )
    parser.add_argument("--greedy", action="store_true", help="always the most likely token (as --top-k 1)")
    parser.add_argument(
        "--num-threads", type=option(runner, "num_threads", int), default=2, help="CPU threads (default: 2)"
    )
    args = parser.parse_args(argv)
    if args.greedy and args.top_k not in (None, 1):
        parser.error("--greedy is --top-k 1; leave out --top-k.")
    if args.system is not None and not args.chat:
        parser.error("--system goes with --chat.")

    top_k = 1 if args.greedy else args.top_k
    sampler = {"top_k": top_k, "top_p": args.top_p, "temperature": args.temperature, "seed": args.seed}
    try:
        model = runner.LiteRTLMModel(args.bundle, num_threads=args.num_threads)
        if args.chat:
            chat(model, args.system, args.max_new_tokens, sampler)
        else:
            model.check_request(args.prompt, args.max_new_tokens, **sampler)
            print(args.prompt, end="", flush=True)
            for text in model.stream(args.prompt, args.max_new_tokens, **sampler):
                print(text, end="", flush=True)
            print()
    except (OSError, ValueError) as error:
        print(f"serve failed: {error}", file=sys.stderr)
        return 1
    return 0


def chat(model, system, max_new_tokens, sampler):
    """A conversation on stdin and stdout: each line a user's message, each reply streamed."""
    if not model.metadata.jinja_prompt_template:
        raise ValueError(f"{model.path.name} has no chat template: --chat needs the bundle of a chat model.")
    messages = [{"role": "system", "content": system}] if system else []
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            return
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line.rstrip("\n")})
        reply = []
        for text in model.stream_chat(messages, max_new_tokens, **sampler):
            print(text, end="", flush=True)
            reply.append(text)
        print(flush=True)
        messages.append({"role": "assistant", "content": "".join(reply)})


if __name__ == "__main__":
    sys.exit(main())
