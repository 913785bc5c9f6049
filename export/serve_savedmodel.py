"""Serves a kzoo SavedModel with plain TensorFlow: no kzoo, no Keras model code.

    python export/serve_savedmodel.py DIR/savedmodel --token-ids 72,105,33
        [--segment-ids ...] [--encoder-token-ids 10,11,12] [--max-length 32] [--stop-token-ids 6]
    python export/serve_savedmodel.py DIR/savedmodel --text "ROMEO:" [--max-new-tokens 32]

Runs `serving_default` on one sequence (its padding mask all ones) and prints the output
(the next-token argmax for language models, class probabilities, or tags). When the
SavedModel has a `generate` signature (GPT, seq2seq) it also generates greedily up to
`--max-length` tokens and prints the ids. For a seq2seq model `--token-ids` is the decoder
prompt (e.g. the [BOS] id) and `--encoder-token-ids` the source.

With `--text`, a model exported with its tokenizer takes the raw string instead: its
`classify_text` signature prints the class probabilities, its `generate_text` signature the
generated text. A WordPiece tokenizer's ops come from `tensorflow_text` (installed with
keras-hub), imported here before loading.
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

try:
    import tensorflow_text  # noqa: E402, F401 (registers the WordPiece ops of a text signature)
except ImportError:
    tensorflow_text = None
from serving_example import describe  # noqa: E402
from serving_example import id_arguments  # noqa: E402
from serving_example import ids  # noqa: E402
from serving_example import naming_flags  # noqa: E402
from serving_example import serving_inputs  # noqa: E402

# What kzoo's exporter writes beside the signatures (`kzoo.export.ServingSignatures.info`).
INFO_FILE = os.path.join("assets.extra", "kzoo_model.json")
# The inputs of kzoo's `serving_default`: a model takes either of the first two.
SERVING_INPUTS = ({"token_ids"}, {"encoder_token_ids", "decoder_token_ids"})


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


def serve_text(loaded, text, max_new_tokens, stop_token_ids):
    """Prints what the text signature gives for one string."""
    if "classify_text" in loaded.signatures:
        outputs = loaded.signatures["classify_text"](text=tf.constant([text]))
        print("class probabilities:", [round(float(p), 4) for p in outputs["probabilities"].numpy()[0]])
        return
    if "generate_text" not in loaded.signatures:
        raise SystemExit("This SavedModel has no text signature: export the model with its tokenizer beside it.")
    signature = loaded.signatures["generate_text"]
    arguments = {"text": tf.constant([text]), "max_new_tokens": tf.constant(max_new_tokens)}
    if "stop_token_ids" in signature.structured_input_signature[1]:
        arguments["stop_token_ids"] = tf.constant(stop_token_ids, tf.int32)
    print("generated text:", repr(signature(**arguments)["text"].numpy()[0].decode()))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("savedmodel", help="the savedmodel folder written by export/export.py")
    inputs = parser.add_mutually_exclusive_group(required=True)
    inputs.add_argument("--token-ids", type=ids, help="comma-separated ids (seq2seq: the decoder prompt)")
    inputs.add_argument("--text", help="a raw string, for a model exported with its tokenizer")
    parser.add_argument("--segment-ids", type=ids, help="BERT segment ids (default: all 0)")
    parser.add_argument("--encoder-token-ids", type=ids, help="seq2seq: the source ids")
    parser.add_argument("--max-length", type=int, default=32, help="generation: total length (default: 32)")
    parser.add_argument("--stop-token-ids", type=ids, default=[], help="generation: ids that end it")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="--text generation: new tokens (default: 32)")
    args = parser.parse_args(id_arguments(sys.argv[1:] if argv is None else argv))
    loaded, info = load(parser, args.savedmodel)
    try:
        check_arguments(args, info, "generate" in loaded.signatures)
    except ValueError as error:
        parser.error(naming_flags(str(error)))
    print("signatures:", sorted(loaded.signatures))
    try:
        if args.text is not None:
            serve_text(loaded, args.text, args.max_new_tokens, args.stop_token_ids)
            return 0
        serving = loaded.signatures["serving_default"]
        names = serving.structured_input_signature[1]
        inputs = serving_inputs(names, args.token_ids, args.segment_ids, args.encoder_token_ids)
        outputs = serving(**{name: tf.constant(value) for name, value in inputs.items()})
        print(describe({name: value.numpy() for name, value in outputs.items()}))
        if "generate" in loaded.signatures:
            tokens = generate(
                loaded.signatures["generate"],
                args.token_ids,
                args.max_length,
                args.stop_token_ids,
                args.encoder_token_ids,
            )
            print("generated:", tokens)
    except tf.errors.InvalidArgumentError as error:  # The model's own checks (ids, lengths), for files without info.
        parser.error(error.message.strip().splitlines()[0])
    return 0


def load(parser, path):
    """The SavedModel at `path` and its `kzoo_model.json` ({} for files exported before it);
    exits with a message if it is not a SavedModel with kzoo's signatures."""
    try:
        loaded = tf.saved_model.load(path)
    except (OSError, ValueError) as error:
        parser.error(f"Cannot load a SavedModel from {path}: {str(error).strip().splitlines()[0]}")
    serving = loaded.signatures.get("serving_default")
    names = set(serving.structured_input_signature[1]) if serving is not None else set()
    if not any(required <= names for required in SERVING_INPUTS):
        parser.error(
            f"{path} has no kzoo serving signatures (serving_default with token_ids, or encoder_token_ids and "
            f"decoder_token_ids; it has {sorted(loaded.signatures) or 'no signatures'}): "
            "export the model with export/export.py."
        )
    info_path = os.path.join(path, INFO_FILE)
    info = json.loads(open(info_path, encoding="utf-8").read()) if os.path.isfile(info_path) else {}
    return loaded, info


def check_arguments(args, info, generates):
    """Raises ValueError naming the argument that the model cannot take (ids, lengths, text)."""
    vocabulary_size, limit = info.get("vocabulary_size"), info.get("max_sequence_length")
    if args.text is not None:
        try:
            args.text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("`--text` is not valid UTF-8: pass the text in UTF-8.") from None
        if args.max_new_tokens < 1:
            raise ValueError(f"`--max-new-tokens` must be >= 1; received {args.max_new_tokens}.")
        return
    for name in ("token_ids", "encoder_token_ids", "stop_token_ids", "segment_ids"):
        values = getattr(args, name)
        if values is None:
            continue
        if not values and name != "stop_token_ids":
            raise ValueError(f"`{name}` is empty: pass at least one id.")
        bound = vocabulary_size if name != "segment_ids" else None
        outside = [value for value in values if value < 0 or (bound is not None and value >= bound)]
        if outside:
            allowed = f"[0, {bound}) (the model's vocabulary_size)" if bound is not None else ">= 0"
            raise ValueError(f"`{name}` must be in {allowed}; received {outside[0]}.")
        if limit is not None and name != "stop_token_ids" and len(values) > limit:
            raise ValueError(f"`{name}` has {len(values)} ids, more than the model's maximum of {limit}.")
    if generates and not len(args.token_ids) < args.max_length <= (limit or args.max_length):
        raise ValueError(
            f"`max_length` ({args.max_length}) must be > the prompt length ({len(args.token_ids)})"
            + (f" and <= the model's maximum length ({limit})." if limit else ".")
        )


if __name__ == "__main__":
    sys.exit(main())
