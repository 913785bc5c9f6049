"""What an exported artifact must satisfy against its Keras model, and how it is measured."""

import numpy as np

# float32 artifacts compute what Keras computes: the largest |logit difference| allowed, per
# unit of the largest |logit| (`fp32_tolerance`): float32 rounding grows with the values, and
# real checkpoints have large logits.
FP32_TOLERANCE = 1e-4

# Quantized artifacts: the largest increase of the held-out cross-entropy
# (nats per target token or example) over Keras' allowed by default;
# exp(bound) is the perplexity ratio (1.01, 1.05, 1.11, 1.16). Each passes a trained model's
# bundle on held-out text and on synthetic rows (targets: Keras' own argmax), with room to spare
# (BENCHMARKS.md). A checkpoint whose weights come as Q4_1 (4 bits with an offset per block),
# which symmetric int4 blocks cannot hold, rises more: its int4 export takes
# `--quality-bound litertlm_int4=...`.
QUALITY_BOUNDS = {
    "tflite_fp16": 0.01,
    "tflite_int8_dynamic": 0.05,
    "tflite_int8": 0.10,
    "litertlm_int8": 0.05,
    "litertlm_int4": 0.15,
}

# The short length checked besides 1 and the full length.
SHORT_LENGTH = 7


def checked_lengths(max_length):
    """The sequence lengths every artifact is compared with Keras at: 1, short, full."""
    return sorted({1, min(SHORT_LENGTH, max_length), max_length})


# Positions of a row's logits measured at a time (`max_abs_diff`, `Quality.add`): their float64
# temporaries then fit in the caches and the C heap reuses them, where a whole row's (256 positions
# at Qwen2.5's vocabulary: 311 MB each) were mapped and faulted in afresh, several per row.
POSITIONS_AT_ONCE = 16


def fp32_tolerance(reference_logits):
    """The largest |logit difference| a float32 artifact may have from `reference_logits`:
    `FP32_TOLERANCE` times their largest magnitude, and at least `FP32_TOLERANCE`."""
    largest = max(float(np.max(reference_logits)), -float(np.min(reference_logits)))  # no |copy| of gigabytes
    return FP32_TOLERANCE * max(1.0, largest)


def max_abs_diff(values, reference):
    """The largest |values - reference|, in float64, a row of the first axis and
    `POSITIONS_AT_ONCE` positions at a time where the two have one shape: a whole batch's logits
    in float64 are gigabytes at a real vocabulary."""
    values, reference = np.asarray(values), np.asarray(reference)
    if values.ndim > 2 and values.shape == reference.shape:
        return max(max_abs_diff(row, reference_row) for row, reference_row in zip(values, reference))
    if values.ndim == 2 and values.shape == reference.shape and len(values) > POSITIONS_AT_ONCE:
        return max(
            max_abs_diff(values[start : start + POSITIONS_AT_ONCE], reference[start : start + POSITIONS_AT_ONCE])
            for start in range(0, len(values), POSITIONS_AT_ONCE)
        )
    return float(np.max(np.abs(values.astype(np.float64) - reference.astype(np.float64))))


def quality(logits, targets, sample_weight=None, reference_logits=None):
    """Held-out quality of `logits` `(..., C)` against int `targets` `(...)`.

    Returns:
        A dict: `cross_entropy` (weighted mean, nats), `perplexity`
        (its exp), `accuracy` (weighted top-1) and, with `reference_logits`,
        `top1_agreement`: the weighted share of positions whose argmax is
        the reference's.
    """
    measure = Quality()
    reference = None if reference_logits is None else np.asarray(reference_logits).argmax(-1)
    measure.add(logits, targets, sample_weight, reference)
    return measure.result()


class Quality:
    """`quality` summed over batches of rows (`add`), so that no more than one batch of logits
    (rows x positions x vocabulary, gigabytes at a real vocabulary) is held at a time."""

    def __init__(self):
        self.total = self.cross_entropy = self.correct = self.agree = 0.0
        self.compared = False

    def add(self, logits, targets, sample_weight=None, reference_argmax=None):
        """Adds a batch: `logits` `(..., C)`, int `targets` `(...)`, its weights, and the
        reference's argmax `(...)` for `top1_agreement` (given with every batch or none).

        Rows of a batch `(N, T, C)` are measured one at a time, and `POSITIONS_AT_ONCE` positions
        of each at a time: the float64 copies of a whole batch's logits and their exponentials are
        gigabytes at a real vocabulary."""
        if np.ndim(logits) > 2:
            for i in range(len(logits)):
                row = (None if values is None else values[i] for values in (sample_weight, reference_argmax))
                self.add(logits[i], targets[i], *row)
            return
        if np.ndim(logits) == 2 and len(logits) > POSITIONS_AT_ONCE:
            for start in range(0, len(logits), POSITIONS_AT_ONCE):
                cut = slice(start, start + POSITIONS_AT_ONCE)
                rows = (None if values is None else values[cut] for values in (sample_weight, reference_argmax))
                self.add(logits[cut], targets[cut], *rows)
            return
        logits = np.asarray(logits, np.float64)
        weights = np.ones(targets.shape) if sample_weight is None else np.asarray(sample_weight, np.float64)
        top = logits.max(-1)
        log_norm = np.log(np.sum(np.exp(logits - top[..., None]), -1)) + top
        target_logits = np.take_along_axis(logits, targets[..., None].astype(np.int64), -1)[..., 0]
        predictions = logits.argmax(-1)
        self.total += weights.sum()
        self.cross_entropy += np.sum((log_norm - target_logits) * weights)
        self.correct += np.sum((predictions == targets) * weights)
        if reference_argmax is not None:
            self.compared = True
            self.agree += np.sum((predictions == reference_argmax) * weights)

    def result(self):
        cross_entropy = float(self.cross_entropy / self.total)
        result = {
            "cross_entropy": cross_entropy,
            "perplexity": float(np.exp(cross_entropy)),
            "accuracy": float(self.correct / self.total),
        }
        if self.compared:
            result["top1_agreement"] = float(self.agree / self.total)
        return result


def text(value):
    """A detokenized string (str, bytes or a scalar string tensor) as str. Bytes are decoded
    leniently, U+FFFD for what is not UTF-8: a byte-level BPE generation can end in the middle
    of a character. Every text comparison of the export decodes both sides with this."""
    value = value.numpy() if hasattr(value, "numpy") else value
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def compare_generations(generated, reference, prompt_lengths):
    """`{"matches_keras", "token_agreement"}` of lists of token lists: whether
    every sequence equals its reference, and the share of equal generated
    tokens (after each prompt; a position only one of them reached counts
    as different)."""
    generated = [[int(token) for token in tokens] for tokens in generated]
    reference = [[int(token) for token in tokens] for tokens in reference]
    equal = total = 0
    for tokens, expected, start in zip(generated, reference, prompt_lengths):
        total += max(len(tokens), len(expected)) - start
        equal += sum(a == b for a, b in zip(tokens[start:], expected[start:]))
    return {"matches_keras": generated == reference, "token_agreement": equal / max(total, 1)}


def failures(name, record):
    """Messages for every check the report `record` of the artifact `name` fails: a quantized
    one (its quality has a `bound`) the held-out cross-entropy bound, a float32 one the
    tolerance at each checked length, and Keras' generation, tokenizer and text signature."""
    quality = record["quality"]
    if "bound" in quality:
        if quality["cross_entropy_increase"] <= quality["bound"]:
            return []
        return [
            f"{name}: the held-out cross-entropy rises by {quality['cross_entropy_increase']:.4f} nats over Keras "
            f"({quality['cross_entropy']:.4f}), above the bound {quality['bound']:g}; "
            "pass a looser bound (--quality-bound) or leave this format out."
        ]
    messages = []
    for length, difference in record["max_abs_diff"].items():
        tolerance = record["tolerance"][length]
        if not difference <= tolerance:
            messages.append(
                f"{name}: max |logit difference| from Keras is {difference:.3g} at length {length}, above the "
                f"float32 tolerance {tolerance:.3g} ({FP32_TOLERANCE:g} x max(1, the largest |logit|))."
            )
    generation, tokenizer, text = record.get("generation"), record.get("tokenizer"), record.get("text")
    if generation and not generation["matches_keras"]:
        messages.append(
            f"{name}: greedy generation differs from Keras "
            f"({generation['token_agreement']:.0%} of the generated tokens agree)."
        )
    if tokenizer and not tokenizer["matches_keras"]:
        messages.append(f"{name}: the bundle's tokenizer gives other ids than the Keras tokenizer.")
    if text and not text["matches_keras"]:
        messages.append(f"{name}: the text signature on raw strings differs from Keras: {text}")
    return messages
