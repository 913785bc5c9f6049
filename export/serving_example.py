"""What `serve_savedmodel.py` and `serve_tflite.py` share: one sequence in, one line out.

NumPy only, so that the TFLite example stays free of TensorFlow.
"""

import argparse
import re

import numpy as np

# Flags that take comma-separated ids, which may start with a minus sign.
ID_FLAGS = ("--token-ids", "--segment-ids", "--encoder-token-ids", "--stop-token-ids")


def ids(text):
    """ "72,105,33" -> [72, 105, 33] (argparse type); anything but integers is refused."""
    tokens = [token.strip() for token in text.split(",") if token.strip()]
    if not tokens or not all(re.fullmatch(r"[+-]?\d+", token) for token in tokens):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 72,105,33; received {text!r}")
    return [int(token) for token in tokens]


# The flag that gives each input the servers check, for their messages.
FLAGS = {
    "token_ids": "--token-ids",
    "prompt_ids": "--token-ids",
    "decoder_token_ids": "--token-ids",
    "encoder_token_ids": "--encoder-token-ids",
    "segment_ids": "--segment-ids",
    "stop_token_ids": "--stop-token-ids",
    "max_length": "--max-length",
}


def naming_flags(message):
    """`message` with each input named as "`token_ids` (--token-ids)"."""
    return re.sub(
        r"`(\w+)`", lambda match: f"{match[0]} ({FLAGS[match[1]]})" if match[1] in FLAGS else match[0], message
    )


def id_arguments(argv):
    """`argv` with `--token-ids -5,2` joined as `--token-ids=-5,2`, which argparse would
    otherwise take for an unknown flag (the server then refuses -5 as an id, by name)."""
    argv = list(argv)
    joined = []
    while argv:
        argument = argv.pop(0)
        if argument in ID_FLAGS and argv and re.fullmatch(r"-\d[\d,\s+-]*", argv[0]):
            argument = f"{argument}={argv.pop(0)}"
        joined.append(argument)
    return joined


def serving_inputs(names, token_ids, segment_ids=None, encoder_token_ids=None):
    """`{input name: (1, T) int32}` for the signature inputs `names`.

    The padding mask is all ones, segments default to 0, a masked LM predicts every
    position, and a seq2seq model reads `encoder_token_ids` with `token_ids` as the
    decoder's input.
    """

    def row(values):
        return np.asarray([values], np.int32)

    if "encoder_token_ids" in names:
        if encoder_token_ids is None:
            raise SystemExit("This is a seq2seq model: pass --encoder-token-ids.")
        inputs = {"encoder_token_ids": row(encoder_token_ids), "decoder_token_ids": row(token_ids)}
    else:
        inputs = {"token_ids": row(token_ids)}
    if "padding_mask" in names:
        inputs["padding_mask"] = row([1] * len(token_ids))
    if "segment_ids" in names:
        inputs["segment_ids"] = row(segment_ids or [0] * len(token_ids))
    if "mask_positions" in names:
        inputs["mask_positions"] = row(list(range(len(token_ids))))
    return inputs


def describe(outputs):
    """A line for the NumPy outputs of `serving_default`: class probabilities, tags, or
    the next-token argmax per position."""
    if "probabilities" in outputs:
        return f"class probabilities: {[round(float(p), 4) for p in outputs['probabilities'][0]]}"
    if "tags" in outputs:
        return f"tags: {outputs['tags'][0].tolist()}"
    return f"next-token argmax per position: {outputs['logits'][0].argmax(-1).tolist()}"
