"""Serves a kzoo SavedModel with plain TensorFlow: no kzoo, no Keras model code.

    python export/serve_savedmodel.py DIR/savedmodel --token-ids 72,105,33
        [--segment-ids ...] [--encoder-token-ids 10,11,12] [--max-length 32] [--stop-token-ids 6]

Runs `serving_default` on one sequence (its padding mask all ones) and prints the output
(the next-token argmax for language models, class probabilities, or tags). When the
SavedModel has a `generate` signature (GPT, seq2seq) it also generates greedily up to
`--max-length` tokens and prints the ids. For a seq2seq model `--token-ids` is the decoder
prompt (e.g. the [BOS] id) and `--encoder-token-ids` the source.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
from serving_example import describe  # noqa: E402
from serving_example import ids  # noqa: E402
from serving_example import serving_inputs  # noqa: E402


def row(values):
    return tf.constant([values], tf.int32)


def generate(signature, prompt, max_length, stop_token_ids, encoder_token_ids):
    """Greedy ids from the `generate` signature: the prompt right-padded to `max_length`."""
    padded = row(prompt + [0] * (max_length - len(prompt)))
    stop = tf.constant(stop_token_ids, tf.int32)
    if "encoder_token_ids" in signature.structured_input_signature[1]:
        outputs = signature(encoder_token_ids=row(encoder_token_ids), decoder_token_ids=padded, stop_token_ids=stop)
    else:
        mask = row([1] * len(prompt) + [0] * (max_length - len(prompt)))
        outputs = signature(token_ids=padded, padding_mask=mask, stop_token_ids=stop)
    keep = outputs["padding_mask"].numpy()[0].astype(bool)
    return outputs["token_ids"].numpy()[0][keep].tolist()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("savedmodel", help="the savedmodel folder written by export/export.py")
    parser.add_argument("--token-ids", type=ids, required=True, help="comma-separated ids (seq2seq: the decoder prompt)")
    parser.add_argument("--segment-ids", type=ids, help="BERT segment ids (default: all 0)")
    parser.add_argument("--encoder-token-ids", type=ids, help="seq2seq: the source ids")
    parser.add_argument("--max-length", type=int, default=32, help="generation: total length (default: 32)")
    parser.add_argument("--stop-token-ids", type=ids, default=[], help="generation: ids that end it")
    args = parser.parse_args(argv)

    loaded = tf.saved_model.load(args.savedmodel)
    print("signatures:", sorted(loaded.signatures))
    serving = loaded.signatures["serving_default"]
    names = serving.structured_input_signature[1]
    inputs = serving_inputs(names, args.token_ids, args.segment_ids, args.encoder_token_ids)
    outputs = serving(**{name: tf.constant(value) for name, value in inputs.items()})
    print(describe({name: value.numpy() for name, value in outputs.items()}))
    if "generate" in loaded.signatures:
        tokens = generate(
            loaded.signatures["generate"], args.token_ids, args.max_length, args.stop_token_ids, args.encoder_token_ids
        )
        print("generated:", tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
