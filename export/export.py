"""Exports a saved kzoo model for serving: SavedModel, TFLite and LiteRT-LM files, verified against Keras.

    python export/export.py MODEL.keras --out DIR
        [--formats savedmodel,tflite_fp32,tflite_fp16,tflite_int8_dynamic,tflite_int8,litertlm,litertlm_int4]
        [--representative-data NAME] [--overwrite]

Writes DIR/savedmodel/, DIR/model_<precision>.tflite, for a causal LM with its tokenizer
DIR/model.litertlm and DIR/model_int8.litertlm (run in LiteRT-LM by export/serve_litertlm.py;
with `litertlm_int4` also DIR/model_int4.litertlm, int4 weights in blocks of 32),
and DIR/export_report.json (sizes, max abs differences from Keras at lengths 1, 7 and full,
quality deltas, latencies); see
`kzoo.export.export`. Exits with status 1 and a message, leaving nothing at DIR, when the
model cannot be read, a format is unknown, DIR cannot be written, the export's estimated peak
memory exceeds the host's available memory (`kzoo.export.memory`; `--ignore-memory-estimate`
exports anyway), or an artifact disagrees with the Keras model beyond its tolerance.

Examples:
    python export/export.py runs/gpt_tiny/model.keras --out runs/gpt_tiny/export
    python export/export.py runs/bert/model.keras --out runs/bert/export \\
        --formats tflite_fp32,tflite_int8 --representative-data kzoo_rt_polarity
"""

import argparse
import math
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")


def count(text):
    """An int >= 1 (argparse type)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1; received {text!r}")
    return value


def make_parser():
    """The command line's parser (`main` also reports through it the formats of `--quality-bound`)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "model", help="the .keras file of a kzoo model, a GGUF file, or a preset with weights (smollm2_135m_instruct)"
    )
    parser.add_argument("--out", required=True, help="the folder to create")
    parser.add_argument(
        "--formats",
        help="comma-separated: savedmodel, tflite_fp32, tflite_fp16, tflite_int8_dynamic, tflite_int8, litertlm, "
        "litertlm_int4 (default: all but the opt-in tflite_int8 and litertlm_int4; litertlm for causal LMs with a "
        "tokenizer)",
    )
    parser.add_argument(
        "--representative-data",
        metavar="NAME",
        help="a kzoo dataset (e.g. kzoo_tiny_shakespeare) read with the model's tokenizer, for calibration "
        'and held-out checks, or "synthetic" for random token ids (default: kzoo_tiny_shakespeare for a causal '
        "LM with a tokenizer, else synthetic)",
    )
    parser.add_argument("--tokenizer-dir", help="where the model's tokenizer.json is (default: the model's folder)")
    parser.add_argument("--data-dir", help="the tensorflow-datasets folder (default: tfds' own)")
    parser.add_argument(
        "--max-length",
        type=count,
        help="the full sequence length checked (default: 256, or the model's maximum or the cache where shorter)",
    )
    parser.add_argument(
        "--cache-length",
        type=count,
        help="positions of the exported KV cache (default: the model's maximum, capped at 4,096)",
    )
    parser.add_argument(
        "--prefill-lengths",
        type=lengths,
        help="LiteRT-LM prefill chunk lengths, e.g. 16,64 (default: 16, 64, 256 where they divide the cache)",
    )
    parser.add_argument(
        "--cache-spans",
        type=spans,
        default="auto",
        help="cache prefixes LiteRT-LM attention reads instead of the whole cache, so that a step costs what its "
        'position has reached: "auto" (halves of the cache down to a sixteenth), e.g. 256,512,1024, or "none" '
        "(default: auto)",
    )
    parser.add_argument("--num-examples", type=count, default=32, help="held-out rows (default: 32)")
    parser.add_argument(
        "--num-representative", type=count, default=32, help="calibration rows for tflite_int8 (default: 32)"
    )
    parser.add_argument(
        "--generate-tokens", type=count, default=32, help="new tokens per generation check (default: 32)"
    )
    parser.add_argument("--latency-runs", type=count, default=20, help="timed calls per latency median (default: 20)")
    parser.add_argument(
        "--quality-bound",
        action="append",
        type=quality_bound,
        default=[],
        metavar="FORMAT=NATS",
        help="largest held-out cross-entropy increase allowed for a quantized format, e.g. tflite_int8=0.2 "
        "(default: tflite_fp16=0.01, tflite_int8_dynamic=0.05, tflite_int8=0.1, litertlm_int8=0.05, "
        "litertlm_int4=0.15)",
    )
    parser.add_argument(
        "--compare-model-export", action="store_true", help="also report the size of Keras' model.export"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace DIR if it exists")
    parser.add_argument(
        "--ignore-memory-estimate",
        action="store_true",
        help="export even where the estimated peak memory exceeds the host's available memory "
        "(kzoo.export.memory; by default the export is refused before anything is converted)",
    )
    parser.add_argument(
        "--int4-rerounding",
        type=float,
        default=0.0,
        metavar="NATS",
        help="with litertlm_int4: put a GGUF's 5- to 8-bit weight groups into int4 blocks where they move the "
        "model's predictions by at most NATS (mean KL divergence, measured at export; e.g. 0.01); default 0: "
        "they stay int8",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="also show TensorFlow's and LiteRT's own log lines (see kzoo.logs)"
    )
    return parser


def spans(text):
    """ "auto", "none" or "256,512" -> "auto", "none" or [256, 512] (argparse type)."""
    return text if text in ("auto", "none") else lengths(text)


def lengths(text):
    """ "16,64" -> [16, 64] (argparse type)."""
    try:
        values = [int(n) for n in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"takes comma-separated integers >= 1, e.g. 16,64; received {text!r}")
    return values


def quality_bound(text):
    """ "tflite_int8=0.2" -> ("tflite_int8", 0.2), the bound a finite number >= 0 (argparse type;
    the format is checked by `quality_bounds`, once kzoo is imported)."""
    name, equals, value = text.partition("=")
    try:
        nats = float(value)
    except ValueError:
        nats = math.nan
    if not equals or not name.strip() or not math.isfinite(nats) or nats < 0:
        raise argparse.ArgumentTypeError(
            f"takes FORMAT=NATS, NATS a finite number >= 0, e.g. tflite_int8=0.2; received {text!r}"
        )
    return name.strip(), nats


def quality_bounds(parser, pairs, known):
    """The `--quality-bound` pairs as a dict, each format one of `known` (a misspelt one would
    otherwise be ignored); exits through `parser.error` before the export starts."""
    for name, nats in pairs:
        if name not in known:
            parser.error(
                f"argument --quality-bound: {name!r} has no quality bound; choose from {', '.join(known)}; "
                f"received {name}={nats:g}"
            )
    return dict(pairs)


def summary(report):
    """One line per artifact: size, largest difference from Keras, quality change, latency."""
    lines = []
    for name, artifact in report["artifacts"].items():
        quality = artifact["quality"]
        delta = quality.get("cross_entropy_increase")
        generation, text = artifact.get("generation"), artifact.get("text")
        lines.append(
            f"{name:20s} {artifact['size_bytes'] / 1e6:8.2f} MB  "
            f"max|diff| {max(artifact['max_abs_diff'].values()):.2e}  "
            + (
                f"cross-entropy {delta:+.4f}" + (f" (bound {quality['bound']:g})  " if "bound" in quality else "  ")
                if delta is not None
                else ""
            )
            + (f"generation {'=' if generation['matches_keras'] else '!='} Keras  " if generation else "")
            + (f"text signature {'=' if text['matches_keras'] else '!='} Keras  " if text else "")
            + "  ".join(f"{key} {value:.2f} ms" for key, value in artifact["latency_ms"].items())
        )
    return "\n".join(lines)


def main(argv=None):
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.verbose:  # before kzoo imports TensorFlow: kzoo.logs leaves a level that is set alone
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0")
    import kzoo
    from kzoo import export as kzoo_export

    kzoo.logs.quiet(args.verbose)  # the Python loggers (tensorflow-datasets' notes) and known warnings
    bounds = quality_bounds(parser, args.quality_bound, kzoo_export.verification.QUALITY_BOUNDS)
    try:
        report = kzoo_export.export(
            args.model,
            args.out,
            formats=args.formats,
            representative_data=args.representative_data,
            tokenizer_dir=args.tokenizer_dir,
            data_dir=args.data_dir,
            max_length=args.max_length,
            cache_length=args.cache_length,
            num_examples=args.num_examples,
            num_representative=args.num_representative,
            generate_tokens=args.generate_tokens,
            latency_runs=args.latency_runs,
            quality_bounds=bounds,
            compare_model_export=args.compare_model_export,
            overwrite=args.overwrite,
            prefill_lengths=args.prefill_lengths,
            cache_spans=args.cache_spans,
            ignore_memory_estimate=args.ignore_memory_estimate,
            int4_rerounding=args.int4_rerounding,
        )
    except kzoo_export.ExportError as error:
        print(f"export failed: {error}", file=sys.stderr)
        return 1
    print(summary(report))
    print(f"Wrote {args.out} ({kzoo_export.REPORT_FILE} has the details).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
