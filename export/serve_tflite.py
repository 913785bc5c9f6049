"""Serves a kzoo `.tflite` file with LiteRT only: NumPy and ai_edge_litert, no TensorFlow.

    python export/serve_tflite.py DIR/model_fp32.tflite --token-ids 72,105,33
        [--segment-ids ...] [--encoder-token-ids 10,11,12] [--max-length 32] [--stop-token-ids 6]

Runs `serving_default` on one sequence and prints the class probabilities, tags or the
next-token argmax; when the file has `prefill` and `decode` signatures (GPT, seq2seq) it
also generates greedily, the KV cache passed between the calls as explicit tensors. For a
seq2seq model `--token-ids` is the decoder prompt (e.g. the [BOS] id) and
`--encoder-token-ids` the source.

The runner, `kzoo/export/litert_model.py`, is loaded by its path: importing the `kzoo`
package would import TensorFlow. To serve without kzoo, copy it beside this file with
`serving_example.py`.
"""

import argparse
import importlib.util
import sys
from pathlib import Path

from serving_example import describe
from serving_example import id_arguments
from serving_example import ids
from serving_example import naming_flags
from serving_example import serving_inputs

DEFAULT_MAX_LENGTH = 32


def load_runner():
    """`kzoo.export.litert_model`, from beside this file or from the kzoo repository."""
    here = Path(__file__).resolve().parent
    for path in (here / "litert_model.py", here.parent / "kzoo" / "export" / "litert_model.py"):
        if path.is_file():
            spec = importlib.util.spec_from_file_location("litert_model", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    raise SystemExit("litert_model.py not found: copy kzoo/export/litert_model.py beside this script.")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a .tflite file written by export/export.py")
    parser.add_argument(
        "--token-ids", type=ids, required=True, help="comma-separated ids (seq2seq: the decoder prompt)"
    )
    parser.add_argument("--segment-ids", type=ids, help="BERT segment ids (default: all 0)")
    parser.add_argument("--encoder-token-ids", type=ids, help="seq2seq: the source ids")
    parser.add_argument(
        "--max-length",
        type=int,
        help=f"generation: total length (default: {DEFAULT_MAX_LENGTH}, or the cache length if shorter)",
    )
    parser.add_argument("--stop-token-ids", type=ids, default=[], help="generation: ids that end it")
    parser.add_argument("--num-threads", type=int, default=2, help="LiteRT CPU threads (default: 2)")
    args = parser.parse_args(id_arguments(sys.argv[1:] if argv is None else argv))
    if args.num_threads < 1:
        parser.error(f"--num-threads must be >= 1; received {args.num_threads}.")

    # The runner checks every input (ids, lengths) before running: its errors name them.
    try:
        model = load_runner().LiteRTModel(args.model, num_threads=args.num_threads)
        print("signatures:", sorted(model.signatures))
        names = model.input_details("serving_default")
        inputs = serving_inputs(names, args.token_ids, args.segment_ids, args.encoder_token_ids)
        outputs = model.run("serving_default", **inputs)
        print(describe(outputs))
        if "decode" in model.signatures:
            max_length = min(DEFAULT_MAX_LENGTH, model.cache_length) if args.max_length is None else args.max_length
            tokens = model.generate(args.token_ids, max_length, args.stop_token_ids, args.encoder_token_ids)
            print("generated:", tokens)
    except (ValueError, FileNotFoundError) as error:
        parser.error(naming_flags(str(error)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
