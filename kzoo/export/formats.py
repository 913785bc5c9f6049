"""The formats `kzoo.export.export` writes: each builds its file, measures it against Keras, and reports.

A format has a `name` (its key in the report) and three methods:

- `refusal(context)`: why it cannot be made for this model, or None;
- `build(context) -> record`: writes its file into `context.staging` and measures it against the
  Keras model (`context.keras`, `context.generation`, ...; see `kzoo.export.exporter.Context`);
- `failures(record)`: the checks the record fails, as messages (`verification.failures`).

`FORMATS` maps each name `export` takes to the formats it makes. A new format is one class (or
one more instance of one) and one entry there.
"""

import tempfile
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from kzoo import logs
from kzoo.export import litertlm
from kzoo.export import verification
from kzoo.export.litert_model import LiteRTModel
from kzoo.export.litert_model import median_ms
from kzoo.export.serving_signatures import RECURRENT
from kzoo.export.tflite.convert import TFLITE_FORMATS
from kzoo.export.tflite.convert import convert
from kzoo.export.tflite.graph_passes import activation_types
from kzoo.export.tflite.graph_passes import op_census

# LiteRT's Python interpreter defaults to 1 thread; kzoo measures with 2.
LITERT_THREADS = 2
# Held-out rows the LiteRT-LM bundles' logits are checked on (one decode call per token).
LITERTLM_ROWS = 8


class ExportError(Exception):
    """An export that could not be written or did not verify. Nothing was left at the output path."""


def tflite_file_name(tflite_format):
    """ "tflite_int8_dynamic" -> "model_int8_dynamic.tflite"."""
    return f"model_{tflite_format.removeprefix('tflite_')}.tflite"


class Format:
    """One exported file (see the module docstring)."""

    name = None
    # Whether `build` runs the Keras model (or traces it) beyond what the context computed once.
    needs_keras_model = True

    def refusal(self, context):
        return None

    def build(self, context):
        raise NotImplementedError

    def failures(self, record):
        return verification.failures(self.name, record)


class SavedModel(Format):
    """`savedmodel/`: `ServingSignatures`' SavedModel, loaded back with TensorFlow: its logits
    within the float32 tolerance of Keras', its `generate` giving Keras' greedy tokens, and its
    text signature what Keras gives on the same strings tokenized in Python."""

    name = "savedmodel"

    def build(self, context):
        path = context.staging / self.name
        start = time.perf_counter()
        context.signatures.save(path)
        seconds = time.perf_counter() - start
        loaded = tf.saved_model.load(str(path))
        serving = loaded.signatures["serving_default"]

        def predict(inputs):
            return serving(**{name: tf.constant(value, tf.int32) for name, value in inputs.items()})["logits"].numpy()

        keras_reference = context.keras
        record = {
            "path": self.name,
            "size_bytes": _folder_bytes(path),
            "variables_bytes": _folder_bytes(path / "variables"),
            "weights_bytes": int(sum(v.numpy().nbytes for v in context.signatures.variables)),
            "signatures": sorted(loaded.signatures),
            "export_seconds": round(seconds, 2),
            **keras_reference.compare(predict),
            "latency_ms": {
                f"serving_default_batch1_length{keras_reference.lengths[-1]}": median_ms(
                    lambda: predict(keras_reference.batch_one), context.settings.latency_runs
                )
            },
        }
        if context.generation:
            record["generation"] = _generation(loaded.signatures["generate"], context.generation)
        if context.text:
            record["text"] = _text(loaded.signatures[context.signatures.text_signature], context.text)
        if context.settings.compare_model_export:
            with tempfile.TemporaryDirectory(dir=context.staging.parent) as keras_export:
                context.model.export(keras_export, format="tf_saved_model", verbose=False)
                record["keras_model_export_size_bytes"] = _folder_bytes(keras_export)
                record["keras_model_export_variables_bytes"] = _folder_bytes(Path(keras_export) / "variables")
        return record


class TFLiteFile(Format):
    """`model_<precision>.tflite` (`TFLITE_FORMATS`), run in LiteRT (`LiteRTModel`): float32
    within the float32 tolerance of Keras' logits and with its greedy tokens, the quantized
    files within their bound on the held-out cross-entropy."""

    def __init__(self, name):
        self.name = name

    def refusal(self, context):
        if self.name == "tflite_int8" and isinstance(context.model, RECURRENT):
            return (
                f"tflite_int8 (full integer) is not available for {type(context.model).__name__}: TFLite's "
                "calibrator crashes on the WHILE loop of recurrent layers (tensorflow/tensorflow#41305). "
                "Use tflite_int8_dynamic (int8 weights)."
            )
        return None

    def build(self, context):
        keras_reference, latency_runs = context.keras, context.settings.latency_runs
        full_integer = self.name == "tflite_int8"
        start = time.perf_counter()
        try:
            # Full integer files serve `serving_default` only: with `prefill` and
            # `decode` the quantizer stores a tied token table twice more.
            flatbuffer = convert(
                context.signatures,
                self.name,
                _representative_dataset(context.data) if full_integer else None,
                generation=not full_integer,
            )
        except Exception as error:  # the converter's errors carry its whole MLIR dump
            message = str(error).strip().splitlines()
            raise ExportError(f"{self.name}: TFLite conversion failed: {message[0] if message else error!r}") from error
        seconds = time.perf_counter() - start
        file_name = tflite_file_name(self.name)
        (context.staging / file_name).write_bytes(flatbuffer)
        with logs.captured_stderr():
            runner = LiteRTModel(flatbuffer, LITERT_THREADS)
        record = {
            "path": file_name,
            "size_bytes": len(flatbuffer),
            "description": TFLITE_FORMATS[self.name],
            "signatures": sorted(runner.signatures),
            "export_seconds": round(seconds, 2),
            "ops": op_census(flatbuffer),
            "activation_types": activation_types(flatbuffer),
            **keras_reference.compare(lambda inputs: runner.run("serving_default", **inputs)["logits"]),
            "latency_ms": {
                f"serving_default_batch1_length{keras_reference.lengths[-1]}": runner.latency_ms(
                    "serving_default", latency_runs, **keras_reference.batch_one
                )
            },
        }
        if self.name in verification.QUALITY_BOUNDS:
            quality = record["quality"]
            quality["cross_entropy_increase"] = quality["cross_entropy"] - context.keras.quality["cross_entropy"]
            quality["bound"] = context.settings.quality_bounds[self.name]
        case = context.generation
        if case and "decode" in runner.signatures:
            steps = []
            generated = [
                runner.generate(
                    prompt,
                    case["max_length"],
                    encoder_token_ids=None if case["sources"] is None else case["sources"][i],
                    on_step=lambda signature, inputs: steps.append((signature, inputs)),
                )
                for i, prompt in enumerate(case["prompts"])
            ]
            record["generation"] = verification.compare_generations(
                generated, case["reference"], [len(p) for p in case["prompts"]]
            )
            decode_inputs = next(inputs for signature, inputs in steps if signature == "decode")
            record["latency_ms"]["decode_step"] = runner.latency_ms("decode", latency_runs, **decode_inputs)
        return record


class LiteRTLMBundle(Format):
    """A `.litertlm` bundle of a causal LM with its tokenizer, its model made as `conversion`
    (a key of `kzoo.export.litertlm.CONVERSIONS`), checked in the LiteRT-LM runtime (`kzoo.export.litertlm.Bundles`):
    the runtime's tokenizer gives Keras' ids, its greedy text is Keras' (float32; int8 and int4:
    the agreement is reported), and its logits over held-out rows are within the float32 tolerance
    or the quality bound."""

    # The bundles' converter and checks take what they need from `context.bundles`, which
    # converts the float32 file with the model it was given.
    needs_keras_model = False

    def __init__(self, name, file_name, conversion):
        self.name, self.file_name, self.conversion = name, file_name, conversion

    def refusal(self, context):
        if context.task != "causal_lm":
            reason = f"LiteRT-LM runs decoder-only language models (GPTCausalLM); this is a {context.task} model"
        elif self.conversion == litertlm.INT4 and litertlm.int4_problem(context.model):
            return f"{self.name}: {litertlm.int4_problem(context.model)}."
        elif context.tokenizer is None:
            reason = (
                "a LiteRT-LM bundle needs the model's tokenizer: save it beside the model "
                "(kzoo.data.save_tokenizer) or pass tokenizer_dir"
            )
        else:
            from kzoo.tokenizers.tokenizer_json import hugging_face_tokenizer

            try:
                hugging_face_tokenizer(context.tokenizer)
                return None
            except ValueError as error:
                reason = str(error)
        return f"litertlm: {reason}."

    def build(self, context):
        try:
            record = context.bundles.write(context.staging / self.file_name, self.conversion)
        except ValueError as error:  # the runtime refused the bundle or a check's request
            raise ExportError(f"{self.name}: {error}") from error
        except RuntimeError as error:  # LiteRT could not prepare or run the bundle's model
            raise ExportError(f"{self.name}: LiteRT could not run the bundle's model: {error}") from error
        if self.name in verification.QUALITY_BOUNDS:
            record["quality"]["bound"] = context.settings.quality_bounds[self.name]
        return record


def _generation(generate, case):
    """The SavedModel's `generate` signature on the generation case, against Keras' tokens."""
    length, rows = case["max_length"], len(case["prompts"])
    prompts = np.zeros((rows, length), np.int32)
    for i, prompt in enumerate(case["prompts"]):
        prompts[i, : len(prompt)] = prompt
    stop = tf.constant([], tf.int32)
    if case["sources"] is None:
        mask = (np.arange(length)[None] < np.array([len(p) for p in case["prompts"]])[:, None]).astype(np.int32)
        outputs = generate(token_ids=tf.constant(prompts), padding_mask=tf.constant(mask), stop_token_ids=stop)
    else:
        sources = np.zeros((rows, max(len(s) for s in case["sources"])), np.int32)
        for i, source in enumerate(case["sources"]):
            sources[i, : len(source)] = source
        outputs = generate(
            encoder_token_ids=tf.constant(sources), decoder_token_ids=tf.constant(prompts), stop_token_ids=stop
        )
    ids, mask = outputs["token_ids"].numpy(), outputs["padding_mask"].numpy().astype(bool)
    generated = [row[keep].tolist() for row, keep in zip(ids, mask)]
    return verification.compare_generations(generated, case["reference"], [len(p) for p in case["prompts"]])


def _text(signature, case):
    """The text signature on the case's strings against the Keras model: `{"texts",
    "matches_keras"}` plus the max probability difference (classifiers) or both texts."""
    texts = tf.constant(case["texts"])
    if "probabilities" in case:
        outputs = signature(text=texts)
        difference = verification.max_abs_diff(outputs["probabilities"].numpy(), case["probabilities"])
        return {
            "texts": case["texts"],
            "max_abs_diff": difference,
            "matches_keras": difference <= verification.FP32_TOLERANCE,
        }
    arguments = {"text": texts, "max_new_tokens": tf.constant(case["max_new_tokens"])}
    if "stop_token_ids" in signature.structured_input_signature[1]:
        arguments["stop_token_ids"] = tf.constant([], tf.int32)
    generated = [verification.text(text) for text in signature(**arguments)["text"]]
    return {
        "texts": case["texts"],
        "generated": generated,
        "keras": case["text"],
        "matches_keras": generated == case["text"],
    }


def _representative_dataset(data):
    """Calibration samples for `serving_default`: batch-1 rows of the representative data."""
    rows = len(next(iter(data.representative.values())))
    samples = [
        ("serving_default", {name: value[i : i + 1] for name, value in data.representative.items()})
        for i in range(rows)
    ]
    return lambda: iter(samples)


def _folder_bytes(path):
    return sum(file.stat().st_size for file in Path(path).rglob("*") if file.is_file())


FORMATS = {
    "savedmodel": (SavedModel(),),
    **{name: (TFLiteFile(name),) for name in TFLITE_FORMATS},
    "litertlm": (
        LiteRTLMBundle("litertlm", "model.litertlm", "tflite_fp32"),
        LiteRTLMBundle("litertlm_int8", "model_int8.litertlm", litertlm.INT8),
    ),
    # Opt-in: the quantizer takes longer than the conversion, and a model must have dimensions
    # that are multiples of the block.
    "litertlm_int4": (LiteRTLMBundle("litertlm_int4", "model_int4.litertlm", litertlm.INT4),),
}
