"""`export`: a kzoo model to a SavedModel and TFLite files that are verified against Keras."""

import glob
import json
import os
import platform
import shutil
import socket
import tempfile
import time
import zipfile
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from kzoo.export import export_data
from kzoo.export import litertlm
from kzoo.export import verification
from kzoo.export.litert_model import LiteRTModel
from kzoo.export.litert_model import median_ms
from kzoo.export.serving_signatures import RECURRENT
from kzoo.export.serving_signatures import ServingSignatures
from kzoo.export.serving_signatures import call_model
from kzoo.export.serving_signatures import check_cache_length
from kzoo.export.serving_signatures import classifier_special_ids
from kzoo.export.serving_signatures import input_names
from kzoo.export.serving_signatures import max_length_of
from kzoo.export.serving_signatures import seq2seq_special_ids
from kzoo.export.serving_signatures import task_of
from kzoo.export.serving_signatures import vocabulary_size_of
from kzoo.export.tflite_conversion import TFLITE_FORMATS
from kzoo.export.tflite_conversion import activation_types
from kzoo.export.tflite_conversion import convert
from kzoo.export.tflite_conversion import op_census

FORMATS = ("savedmodel", *TFLITE_FORMATS, "litertlm")
# Full integer int8 is opt-in: it needs calibration data, and how much it
# costs depends on the model (on random-weight seq2seq models it fails the
# default quality bound), while the other formats verify on every model.
# "litertlm" (LiteRT-LM bundles, fp32 and int8) is left out by default for
# models other than causal LMs with a tokenizer beside them.
DEFAULT_FORMATS = ("savedmodel", "tflite_fp32", "tflite_fp16", "tflite_int8_dynamic", "litertlm")
REPORT_FILE = "export_report.json"
SAVEDMODEL_DIR = "savedmodel"
# LiteRT's Python interpreter defaults to 1 thread; kzoo measures with 2.
LITERT_THREADS = 2
# Rows compared with Keras at each checked length.
COMPARED_ROWS = 4
# Held to the float32 tolerance and to greedy generation equal to Keras'.
FLOAT32_FORMATS = ("savedmodel", "tflite_fp32", "litertlm")
# Held-out rows the LiteRT-LM bundles' logits are checked on (one decode call per token).
LITERTLM_ROWS = 8


class ExportError(Exception):
    """An export that could not be written or did not verify. Nothing was left at the output path."""


def tflite_file_name(tflite_format):
    """ "tflite_int8_dynamic" -> "model_int8_dynamic.tflite"."""
    return f"model_{tflite_format.removeprefix('tflite_')}.tflite"


def export(
    model,
    output_dir,
    formats=None,
    representative_data=None,
    *,
    tokenizer_dir=None,
    data_dir=None,
    max_length=None,
    cache_length=None,
    num_examples=32,
    num_representative=32,
    generate_tokens=32,
    latency_runs=20,
    quality_bounds=None,
    compare_model_export=False,
    overwrite=False,
    seed=0,
    prefill_lengths=None,
):
    """Exports a kzoo model for serving and verifies every file against the Keras model.

    Writes into `output_dir`: `savedmodel/` (signatures `serving_default` and,
    for GPTCausalLM and Seq2SeqTransformer, `generate`; when the model's
    tokenizer is known (the model's own, else one saved beside it), also `classify_text` or `generate_text`
    on raw strings; see `ServingSignatures`), `model_<precision>.tflite` per TFLite format
    (builtin ops only; `prefill`/`decode` signatures for generation), for
    causal LMs with a tokenizer the LiteRT-LM bundles `model.litertlm` and
    `model_int8.litertlm` (see `kzoo.export.litertlm`), and `export_report.json`. Each
    artifact is run on held-out inputs at sequence lengths 1, 7 and the full length and
    compared with the Keras model:

    - float32 (SavedModel, tflite_fp32, litertlm): max |logit difference| <=
      `verification.fp32_tolerance` (1e-4 times the largest |logit|, at
      least 1e-4), and greedy generation equal to
      Keras' `generate` token for token; the text signature gives what the
      Keras model gives on the same strings tokenized in Python.
    - quantized TFLite: the held-out cross-entropy may rise by at most
      `quality_bounds[format]` nats (default `verification.QUALITY_BOUNDS`).
    - LiteRT-LM bundles: run in the LiteRT-LM runtime itself, their tokenizer
      gives the Keras tokenizer's ids and their greedy text is Keras' text
      (float32; int8: the agreement is reported), prompts longer than the
      largest prefill chunk included; the `decode` signature's logits over
      held-out rows are held to the float32 tolerance or the int8 bound
      ("litertlm_int8").

    The report gives per artifact its size, max abs differences, quality
    (cross-entropy, perplexity, accuracy, top-1 agreement with Keras),
    generation agreement and median batch-1 latency (LiteRT with 2 threads).

    Everything is written to a temporary folder beside `output_dir` and
    moved into place only when every check passed; on any failure the
    temporary folder is removed and `ExportError` raised, so `output_dir`
    never holds a partial or unverified export. The temporary folders of an
    export that was killed (named for their host and process) are removed by
    the next export to the same path.

    Args:
        model: a kzoo task model, or the path of its `.keras` file.
        output_dir: the folder to create.
        formats: iterable or comma-separated string of `FORMATS`; defaults
            to `DEFAULT_FORMATS` (all but the opt-in full integer "tflite_int8").
        representative_data: None for synthetic token ids, or a
            `kzoo.data.load` dataset name (e.g. "kzoo_tiny_shakespeare"),
            read with the model's tokenizer: calibration rows from its
            train split, held-out rows from validation (or test).
        tokenizer_dir: for a model that carries no tokenizer (`Task.tokenizer`,
            which the recipes set), where `kzoo.data.save_tokenizer` wrote it;
            defaults to the `.keras` file's folder. Without a tokenizer, the
            SavedModel has no text signature.
        data_dir: the tensorflow-datasets folder for `representative_data`
            (`kzoo.data.load`'s `data_dir`).
        max_length: int, the full sequence length checked; defaults to the
            model's maximum (128 for models without a position table).
        cache_length: int, the TFLite KV cache positions; defaults to the
            model's maximum sequence length.
        num_examples: int, held-out rows (quality metrics).
        num_representative: int, calibration rows for "tflite_int8".
        generate_tokens: int, new tokens per generation check.
        latency_runs: int, timed calls per latency median.
        quality_bounds: dict overriding `verification.QUALITY_BOUNDS`.
        compare_model_export: bool, also measure the SavedModel of Keras'
            `model.export` (for the report; not kept).
        overwrite: bool, replace an existing non-empty `output_dir`.
        seed: int, for synthetic data and calibration sampling.
        prefill_lengths: the LiteRT-LM `prefill_<N>` chunk lengths
            (`kzoo.export.litertlm.prefill_lengths`; default 16, 64, 256 where
            they divide the cache length).

    Returns:
        The report (also written to `output_dir/export_report.json`).

    Raises:
        ExportError: with a message saying what is wrong.

    Example:
    >>> report = export("runs/gpt_tiny/model.keras", "runs/gpt_tiny/export")
    >>> report["artifacts"]["tflite_fp32"]["max_abs_diff"]
    {'1': 3.8e-07, '7': 4.1e-07, '256': 5.2e-07}
    """
    formats = _check_formats(formats)
    _check_counts(
        max_length=max_length,
        cache_length=cache_length,
        num_examples=num_examples,
        num_representative=num_representative,
        generate_tokens=generate_tokens,
        latency_runs=latency_runs,
    )
    output_dir = _check_output_dir(output_dir, overwrite)
    _remove_stale_staging(output_dir)
    model, model_path = _load_model(model)
    try:
        task = task_of(model)
    except ValueError as error:
        raise ExportError(str(error)) from error
    explicit = formats is not None
    formats = _resolve_formats(formats, model)
    names = input_names(model)
    length = _check_length(max_length, model)
    bounds = {**verification.QUALITY_BOUNDS, **(quality_bounds or {})}

    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:  # a model saved before tasks carried their tokenizer: the file beside it
        tokenizer = _load_tokenizer(tokenizer_dir or (model_path.parent if model_path else None), representative_data)
    formats = _check_litertlm(formats, task, tokenizer, explicit)
    data = _export_data(
        representative_data, model, tokenizer, data_dir, task, names, length, num_examples, num_representative, seed
    )
    try:
        check_cache_length(model, cache_length)
        if "litertlm" in formats:
            litertlm.prefill_lengths(check_cache_length(model, cache_length), prefill_lengths)
    except ValueError as error:
        raise ExportError(str(error)) from error
    signatures = ServingSignatures(model, cache_length, tokenizer)
    checks = _KerasReference(model, task, names, data, length, signatures, generate_tokens)

    staging = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.{_owner()}.", suffix=".partial", dir=output_dir.parent))
    try:
        _make_readable(staging)
        artifacts, failures = {}, []
        context = _Context(signatures, checks, staging, latency_runs, bounds)
        for name in formats:
            if name == "savedmodel":
                artifacts[name] = _export_savedmodel(context, model if compare_model_export else None)
            elif name == "litertlm":
                artifacts.update(_export_litertlm(context, model, tokenizer, prefill_lengths))
            else:
                artifacts[name] = _export_tflite(context, name)
            for artifact in (name, "litertlm_int8") if name == "litertlm" else (name,):
                failures += _failures(artifact, artifacts[artifact])
        if failures:
            raise ExportError(
                "The export did not verify against the Keras model, so nothing was written to "
                f"{output_dir}:\n- " + "\n- ".join(failures)
            )
        report = {
            "model": _model_summary(model, model_path, task, signatures),
            "data": {
                "source": data.source,
                "held_out_examples": len(next(iter(data.held_out.values()))),
                "representative_examples": len(next(iter(data.representative.values()))),
                "targets": "labels" if data.targets is not None else "the Keras model's argmax (synthetic data)",
            },
            "checked_lengths": checks.lengths,
            "tolerances": {
                "fp32_max_abs_diff_per_unit_logit": verification.FP32_TOLERANCE,
                "quality_bounds_nats": bounds,
            },
            "keras": {"quality": checks.quality},
            "artifacts": artifacts,
            "environment": _environment(),
        }
        (staging / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        _move_into_place(staging, output_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return report


def _check_formats(formats):
    if formats is None:
        return None
    if isinstance(formats, str):
        formats = formats.split(",")
    formats = [name.strip() for name in formats if name.strip()]
    unknown = [name for name in formats if name not in FORMATS]
    if unknown or not formats:
        raise ExportError(f"Unknown format(s) {unknown or formats}; choose from {', '.join(FORMATS)}.")
    return list(dict.fromkeys(formats))


def _resolve_formats(formats, model):
    if formats is None:
        return list(DEFAULT_FORMATS)
    if isinstance(model, RECURRENT) and "tflite_int8" in formats:
        raise ExportError(
            f"tflite_int8 (full integer) is not available for {type(model).__name__}: TFLite's "
            "calibrator crashes on the WHILE loop of recurrent layers (tensorflow/tensorflow#41305). "
            "Use tflite_int8_dynamic (int8 weights)."
        )
    return formats


def _check_litertlm(formats, task, tokenizer, explicit):
    """`formats` without "litertlm" where it does not apply: refused when asked for by name,
    left out of the defaults."""
    if "litertlm" not in formats:
        return formats
    reason = None
    if task != "causal_lm":
        reason = f"LiteRT-LM runs decoder-only language models (GPTCausalLM); this is a {task} model"
    elif tokenizer is None:
        reason = (
            "a LiteRT-LM bundle needs the model's tokenizer: save it beside the model "
            "(kzoo.data.save_tokenizer) or pass tokenizer_dir"
        )
    else:
        from kzoo.data.tokenizer_json import hugging_face_tokenizer

        try:
            hugging_face_tokenizer(tokenizer)
        except ValueError as error:
            reason = str(error)
    if reason is None:
        return formats
    if explicit:
        raise ExportError(f"litertlm: {reason}.")
    return [name for name in formats if name != "litertlm"]


def _check_counts(**counts):
    """Each count that is given must be an int >= 1 (0 would mean "the default" or divide by zero)."""
    for name, value in counts.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
            raise ExportError(f"`{name}` must be an int >= 1; received {name}={value!r}.")


def _owner():
    """This process, as its temporary folders name it: "<host>-<pid>"."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _remove_stale_staging(output_dir):
    """Removes the temporary folders of killed exports to `output_dir`: a `.partial` staging
    folder, or the earlier export it was replacing (`.replaced`, put back if nothing replaced it).
    Folders of a process of this host that is still running, or of another host, are kept."""
    prefix = f".{output_dir.name}."
    for path in output_dir.parent.glob(f"{glob.escape(prefix)}*"):
        if path.suffix not in (".partial", ".replaced") or not path.is_dir():
            continue
        # ".<name>.<host>-<pid>.<random>.partial" or ".<name>.<host>-<pid>.replaced"
        middle = path.name[len(prefix) : -len(path.suffix)]
        owner = middle.rpartition(".")[0] if path.suffix == ".partial" else middle
        host, _, pid = owner.rpartition("-")
        if host not in (socket.gethostname(), "") or (pid.isdigit() and _running(int(pid))):
            continue
        if path.suffix == ".replaced" and not output_dir.exists():
            path.rename(output_dir)
        else:
            shutil.rmtree(path, ignore_errors=True)


def _running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _check_output_dir(output_dir, overwrite):
    """The absolute output path, after checking that it can be created."""
    output_dir = Path(output_dir).absolute()
    if output_dir.exists() and not output_dir.is_dir():
        raise ExportError(f"The output path {output_dir} is a file, not a folder.")
    if output_dir.is_dir() and any(output_dir.iterdir()) and not overwrite:
        raise ExportError(f"The output folder {output_dir} is not empty; pass --overwrite to replace it.")
    parent = output_dir.parent
    if not parent.is_dir():
        raise ExportError(f"Cannot create {output_dir}: its parent {parent} is not a folder.")
    try:  # os.access is not enough: it ignores read-only mounts and says yes to root
        probe = tempfile.mkdtemp(prefix=f".{output_dir.name}.", suffix=".probe", dir=parent)
    except OSError as error:
        raise ExportError(f"Cannot write into {parent}: {error.strerror}.") from error
    os.rmdir(probe)
    return output_dir


def _make_readable(folder):
    """mkdtemp's folders are private (0o700); the export gets the umask's usual mode."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)


def _move_into_place(staging, output_dir):
    """Renames the finished `staging` folder to `output_dir` (same filesystem:
    atomic), replacing an existing one only once the new one is complete."""
    if not output_dir.exists():
        staging.rename(output_dir)
        return
    retired = output_dir.with_name(f".{output_dir.name}.{_owner()}.replaced")
    output_dir.rename(retired)
    staging.rename(output_dir)
    shutil.rmtree(retired, ignore_errors=True)


def _load_model(model):
    """`(model, path or None)`; a path must be a `.keras` file holding a kzoo model."""
    if isinstance(model, keras.Model):
        return model, None
    path = Path(model)
    if not path.is_file():
        raise ExportError(f"No model file at {path}.")
    if path.suffix != ".keras":
        raise ExportError(f"{path} is not a .keras file; save the model with `model.save('model.keras')`.")
    if not zipfile.is_zipfile(path):
        raise ExportError(f"{path} is not a valid .keras file (not a zip archive: truncated or corrupt?).")
    try:
        return keras.saving.load_model(path), path
    except Exception as error:  # Keras raises many types for a bad archive
        raise ExportError(f"Could not load {path}: {type(error).__name__}: {error}") from error


def _check_length(max_length, model):
    limit = getattr(getattr(model, "backbone", None), "max_sequence_length", None)
    length = max_length_of(model) if max_length is None else max_length
    if length < 1 or (limit is not None and length > limit):
        raise ExportError(f"`max_length` ({length}) must be in [1, {limit or 'inf'}].")
    return length


def _load_tokenizer(directory, representative_data):
    """The tokenizer saved beside the model (`kzoo.data.save_tokenizer`), or None if there is
    none; a named `representative_data` set cannot be read without it."""
    from kzoo.data import load_tokenizer  # kzoo.data imports tensorflow-datasets: only here

    try:
        if directory is None:
            raise FileNotFoundError("a model passed as an object has no folder; pass `tokenizer_dir`")
        return load_tokenizer(directory)
    except FileNotFoundError as error:
        if representative_data is None:
            return None
        raise ExportError(
            f"Representative data {representative_data!r} needs the model's tokenizer: {error}"
        ) from error
    except (ValueError, TypeError, KeyError) as error:  # a corrupt tokenizer.json (JSONDecodeError is a ValueError)
        raise ExportError(
            f"Cannot read the tokenizer saved beside the model in {directory}: {type(error).__name__}: {error}"
        ) from error


def _export_data(name, model, tokenizer, data_dir, task, names, length, num_examples, num_representative, seed):
    vocabulary_size = vocabulary_size_of(model)
    if name is None:
        return export_data.synthetic_data(names, vocabulary_size, length, num_examples, num_representative, seed)
    try:
        return export_data.dataset_data(
            name, tokenizer, task, names, vocabulary_size, length, num_examples, num_representative, seed, data_dir
        )
    except (FileNotFoundError, ValueError, StopIteration) as error:
        raise ExportError(f"Cannot read representative data {name!r}: {error}") from error


class _KerasReference:
    """The Keras model's outputs that every artifact is compared with."""

    def __init__(self, model, task, names, data, length, signatures, generate_tokens):
        self.model, self.names, self.data = model, names, data
        self.generate_tokens = generate_tokens
        self.lengths = verification.checked_lengths(length)
        rows = {name: value[:COMPARED_ROWS] for name, value in data.held_out.items()}
        self.compared = {n: export_data.crop(rows, n) for n in self.lengths}
        self.logits = {n: self.predict(inputs) for n, inputs in self.compared.items()}
        self.full_logits = self.predict(data.held_out)
        self.targets = self.full_logits.argmax(-1) if data.targets is None else data.targets
        self.quality = verification.quality(self.full_logits, self.targets, data.sample_weight)
        self.batch_one = {name: value[:1] for name, value in data.held_out.items()}
        self.generation = (
            _generation_cases(model, task, data, signatures, generate_tokens) if signatures.generates else None
        )
        self.text = _text_cases(model, task, data, signatures, generate_tokens) if signatures.text_signature else None

    def predict(self, inputs):
        return keras.ops.convert_to_numpy(call_model(self.model, self.names, inputs))


def _generation_cases(model, task, data, signatures, generate_tokens):
    """Two greedy generations (short and long context) and the tokens of the Keras model's
    `generate` (without XLA: the exported files run without it too)."""
    held_out = data.held_out
    cache_length = signatures.cache_length
    second = 1 % len(next(iter(held_out.values())))
    if task == "causal_lm":
        short = min(verification.SHORT_LENGTH, cache_length - 1)
        prompts = [held_out["token_ids"][0, :1], held_out["token_ids"][second, :short]]
        max_length = min(cache_length, short + generate_tokens)
        reference = model.generate([p.tolist() for p in prompts], max_length=max_length, jit_compile=False)
        return {"prompts": prompts, "sources": None, "max_length": max_length, "reference": reference}
    sources = [held_out["encoder_token_ids"][0], held_out["encoder_token_ids"][second, : verification.SHORT_LENGTH]]
    start_token_id = int(held_out["decoder_token_ids"][0, 0])  # [BOS] with kzoo's pipelines
    prompts = [[start_token_id]] * 2
    max_length = min(cache_length, 1 + generate_tokens)
    reference = model.generate(
        [source.tolist() for source in sources], start_token_id, max_length=max_length, jit_compile=False
    )
    return {"prompts": prompts, "sources": sources, "max_length": max_length, "reference": reference}


def _text_cases(model, task, data, signatures, generate_tokens):
    """Raw strings for the text signature (the first held-out rows, detokenized) and what the
    Keras model gives for them, tokenized and decoded in Python: probabilities, or text."""
    from kzoo.data import classification_batches

    tokenizer = signatures.tokenizer
    rows = data.held_out["encoder_token_ids" if task == "seq2seq" else "token_ids"][:2]
    texts = [verification.text(tokenizer.detokenize(row[row != 0][: verification.SHORT_LENGTH])) for row in rows]
    case = {"texts": texts, "max_new_tokens": generate_tokens}
    if task == "classifier":
        examples = tf.data.Dataset.from_tensor_slices((texts, [0] * len(texts)))
        cls_id, sep_id = classifier_special_ids(tokenizer)
        batches = classification_batches(
            examples, tokenizer, max_length_of(model), len(texts), start_token_id=cls_id, end_token_id=sep_id
        )
        x, _ = next(iter(batches))
        logits = call_model(
            model, input_names(model), {name: np.asarray(value).astype(np.int32) for name, value in x.items()}
        )
        case["probabilities"] = keras.ops.convert_to_numpy(keras.ops.softmax(logits, axis=-1))
        return case
    prompts = [np.asarray(tokenizer(text)).tolist() for text in texts]
    limit = max_length_of(model)
    if task == "causal_lm":
        length = min(max(map(len, prompts)) + generate_tokens, limit)
        outputs = model.generate(prompts, max_length=length, jit_compile=False)
    else:
        bos_id, eos_id = seq2seq_special_ids(tokenizer)
        sources = [prompt[:limit] for prompt in prompts]
        outputs = model.generate(
            sources, bos_id, max_length=min(1 + generate_tokens, limit), stop_token_ids=[eos_id], jit_compile=False
        )
        outputs = [[token for token in tokens if token not in (bos_id, eos_id)] for tokens in outputs]
    case["text"] = [verification.text(tokenizer.detokenize(tokens)) for tokens in outputs]
    return case


class _Context:
    """What the artifact exporters share."""

    def __init__(self, signatures, checks, staging, latency_runs, bounds):
        self.signatures, self.checks, self.staging = signatures, checks, staging
        self.latency_runs, self.bounds = latency_runs, bounds


def _verify(predict, checks):
    """`max_abs_diff` per checked length, and held-out quality, of a `predict` function."""
    logits = predict(checks.data.held_out)
    return {
        "max_abs_diff": {
            str(n): verification.max_abs_diff(predict(checks.compared[n]), checks.logits[n]) for n in checks.lengths
        },
        "tolerance": {str(n): verification.fp32_tolerance(checks.logits[n]) for n in checks.lengths},
        "quality": verification.quality(
            logits, checks.targets, checks.data.sample_weight, reference_logits=checks.full_logits
        ),
    }


def _folder_bytes(path):
    return sum(file.stat().st_size for file in Path(path).rglob("*") if file.is_file())


def _export_savedmodel(context, model_for_comparison):
    checks = context.checks
    path = context.staging / SAVEDMODEL_DIR
    start = time.perf_counter()
    context.signatures.save(path)
    seconds = time.perf_counter() - start
    loaded = tf.saved_model.load(str(path))
    serving = loaded.signatures["serving_default"]

    def predict(inputs):
        return serving(**{name: tf.constant(value, tf.int32) for name, value in inputs.items()})["logits"].numpy()

    record = {
        "path": SAVEDMODEL_DIR,
        "size_bytes": _folder_bytes(path),
        "variables_bytes": _folder_bytes(path / "variables"),
        "weights_bytes": int(sum(v.numpy().nbytes for v in context.signatures.variables)),
        "signatures": sorted(loaded.signatures),
        "export_seconds": round(seconds, 2),
        **_verify(predict, checks),
        "latency_ms": {
            f"serving_default_batch1_length{checks.lengths[-1]}": median_ms(
                lambda: predict(checks.batch_one), context.latency_runs
            )
        },
    }
    if checks.generation:
        record["generation"] = _savedmodel_generation(loaded.signatures["generate"], checks)
    if checks.text:
        record["text"] = _savedmodel_text(loaded.signatures[context.signatures.text_signature], checks.text)
    if model_for_comparison is not None:
        with tempfile.TemporaryDirectory(dir=context.staging.parent) as keras_export:
            model_for_comparison.export(keras_export, format="tf_saved_model", verbose=False)
            record["keras_model_export_size_bytes"] = _folder_bytes(keras_export)
            record["keras_model_export_variables_bytes"] = _folder_bytes(Path(keras_export) / "variables")
    return record


def _savedmodel_generation(generate, checks):
    case = checks.generation
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


def _savedmodel_text(signature, case):
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


def _export_tflite(context, tflite_format):
    checks, signatures = context.checks, context.signatures
    full_integer = tflite_format == "tflite_int8"
    start = time.perf_counter()
    try:
        # Full integer files serve `serving_default` only: with `prefill` and
        # `decode` the quantizer stores a tied token table twice more.
        flatbuffer = convert(
            signatures,
            tflite_format,
            _representative_dataset(checks.data) if full_integer else None,
            generation=not full_integer,
        )
    except Exception as error:  # the converter's errors carry its whole MLIR dump
        message = str(error).strip().splitlines()
        raise ExportError(f"{tflite_format}: TFLite conversion failed: {message[0] if message else error!r}") from error
    seconds = time.perf_counter() - start
    name = tflite_file_name(tflite_format)
    (context.staging / name).write_bytes(flatbuffer)
    runner = LiteRTModel(flatbuffer, LITERT_THREADS)

    def predict(inputs):
        return runner.run("serving_default", **inputs)["logits"]

    record = {
        "path": name,
        "size_bytes": len(flatbuffer),
        "description": TFLITE_FORMATS[tflite_format],
        "signatures": sorted(runner.signatures),
        "export_seconds": round(seconds, 2),
        "ops": op_census(flatbuffer),
        "activation_types": activation_types(flatbuffer),
        **_verify(predict, checks),
        "latency_ms": {
            f"serving_default_batch1_length{checks.lengths[-1]}": runner.latency_ms(
                "serving_default", context.latency_runs, **checks.batch_one
            )
        },
    }
    if tflite_format != "tflite_fp32":
        bound = context.bounds[tflite_format]
        record["quality"]["cross_entropy_increase"] = (
            record["quality"]["cross_entropy"] - checks.quality["cross_entropy"]
        )
        record["quality"]["bound"] = bound
    if checks.generation and "decode" in runner.signatures:
        case, steps = checks.generation, []
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
        record["latency_ms"]["decode_step"] = runner.latency_ms("decode", context.latency_runs, **decode_inputs)
    return record


def _export_litertlm(context, model, tokenizer, prefill_lengths):
    """The LiteRT-LM bundles, checked in the runtime against the Keras model
    (`kzoo.export.litertlm.export_bundles`) on the first held-out rows."""
    checks = context.checks
    rows = slice(0, LITERTLM_ROWS)
    reference = litertlm.Reference(
        token_ids=checks.data.held_out["token_ids"][rows],
        logits=checks.full_logits[rows],
        targets=checks.targets[rows],
        sample_weight=None if checks.data.sample_weight is None else checks.data.sample_weight[rows],
    )
    try:
        return litertlm.export_bundles(
            model,
            tokenizer,
            context.staging,
            reference,
            cache_length=context.signatures.cache_length,
            lengths=prefill_lengths,
            generate_tokens=checks.generate_tokens,
            quality_bound=context.bounds["litertlm_int8"],
            num_threads=LITERT_THREADS,
        )
    except ValueError as error:
        raise ExportError(f"litertlm: {error}") from error


def _representative_dataset(data):
    """Calibration samples for `serving_default`: batch-1 rows of the representative data."""
    rows = len(next(iter(data.representative.values())))
    samples = [
        ("serving_default", {name: value[i : i + 1] for name, value in data.representative.items()})
        for i in range(rows)
    ]
    return lambda: iter(samples)


def _failures(name, record):
    """Messages for every check `record` fails."""
    failures = []
    quality = record["quality"]
    if name in FLOAT32_FORMATS:
        for length, difference in record["max_abs_diff"].items():
            tolerance = record["tolerance"][length]
            if not difference <= tolerance:
                failures.append(
                    f"{name}: max |logit difference| from Keras is {difference:.3g} at length {length}, "
                    f"above the float32 tolerance {tolerance:.3g} ({verification.FP32_TOLERANCE:g} x max(1, the "
                    "largest |logit|))."
                )
        generation = record.get("generation")
        if generation and not generation["matches_keras"]:
            failures.append(
                f"{name}: greedy generation differs from Keras "
                f"({generation['token_agreement']:.0%} of the generated tokens agree)."
            )
        tokenizer = record.get("tokenizer")
        if tokenizer and not tokenizer["matches_keras"]:
            failures.append(f"{name}: the bundle's tokenizer gives other ids than the Keras tokenizer.")
        text = record.get("text")
        if text and not text["matches_keras"]:
            failures.append(f"{name}: the text signature on raw strings differs from Keras: {text}")
    elif not quality["cross_entropy_increase"] <= quality["bound"]:
        failures.append(
            f"{name}: the held-out cross-entropy rises by {quality['cross_entropy_increase']:.4f} nats over Keras "
            f"({quality['cross_entropy']:.4f}), above the bound {quality['bound']:g}; "
            "pass a looser bound (--quality-bound) or leave this format out."
        )
    return failures


def _model_summary(model, model_path, task, signatures):
    return {
        "path": None if model_path is None else str(model_path),
        "class": type(model).__name__,
        "task": task,
        "parameters": int(model.count_params()),
        "vocabulary_size": int(vocabulary_size_of(model)),
        "max_sequence_length": getattr(getattr(model, "backbone", None), "max_sequence_length", None),
        "dtype_policy": model.dtype_policy.name,
        "cache_length": signatures.cache_length if signatures.generates else None,
    }


def _environment():
    import ai_edge_litert

    return {
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "ai_edge_litert": ai_edge_litert.__version__,
        "python": platform.python_version(),
        "litert_threads": LITERT_THREADS,
        "TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
        "cpu_count": os.cpu_count(),
    }
