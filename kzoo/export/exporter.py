"""`export`: a kzoo model to SavedModel, TFLite and LiteRT-LM files, each verified against Keras.

The steps: check the settings; in a staging folder beside the output (`kzoo.files.atomic_folder`),
load the model and its data (`Context`), let each format (`kzoo.export.formats`) build its file
and measure it against the Keras model, and move the folder into place only when every format
passed its checks.
"""

import contextlib
import functools
import json
import math
import os
import platform
import shutil
import types
import zipfile
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from kzoo import files
from kzoo.export import export_data
from kzoo.export import formats as formats_lib
from kzoo.export import litertlm
from kzoo.export import memory
from kzoo.export import verification
from kzoo.export.formats import LITERT_THREADS
from kzoo.export.formats import ExportError
from kzoo.export.serving_signatures import TEXT_SIGNATURES
from kzoo.export.serving_signatures import ServingSignatures
from kzoo.export.serving_signatures import call_model
from kzoo.export.serving_signatures import check_cache_length
from kzoo.export.serving_signatures import classifier_special_ids
from kzoo.export.serving_signatures import input_names
from kzoo.export.serving_signatures import max_length_of
from kzoo.export.serving_signatures import seq2seq_special_ids
from kzoo.export.serving_signatures import task_of
from kzoo.export.serving_signatures import vocabulary_size_of
from kzoo.models import CausalLM

FORMATS = tuple(formats_lib.FORMATS)
# Full integer int8 is opt-in: it needs calibration data, and how much it
# costs depends on the model (on random-weight seq2seq models it fails the
# default quality bound), while the other formats verify on every model.
# "litertlm" (LiteRT-LM bundles, fp32 and int8) is left out by default for
# models other than causal LMs with a tokenizer; "litertlm_int4" is opt-in too.
DEFAULT_FORMATS = ("savedmodel", "tflite_fp32", "tflite_fp16", "tflite_int8_dynamic", "litertlm")
REPORT_FILE = "export_report.json"
# Rows compared with Keras at each checked length.
COMPARED_ROWS = 4
# Held-out rows run at a time for the quality figures (each batch's logits are rows x length x vocabulary).
REFERENCE_ROWS = 4
# The full length checked when no `max_length` is given (or the model's maximum, or the cache,
# where shorter): each check is a pass of this length per held-out row, on the Keras model and
# on every file, and the Keras reference holds the LiteRT-LM check's rows' logits until the
# check has them in a file (8 x 256 x 151,936 float32s, 1.2 GB, at Qwen2.5's vocabulary).
DEFAULT_CHECK_LENGTH = 256


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
    cache_spans="auto",
    ignore_memory_estimate=False,
    int4_rerounding=0.0,
):
    """Exports a kzoo model for serving and verifies every file against the Keras model.

    Writes into `output_dir`: `savedmodel/` (signatures `serving_default` and,
    for GPTCausalLM and Seq2SeqTransformer, `generate`; when the model's
    tokenizer is known (the model's own, else one saved beside it), also `classify_text` or `generate_text`
    on raw strings; see `ServingSignatures`), `model_<precision>.tflite` per TFLite format
    (builtin ops only; `prefill`/`decode` signatures for generation), for
    causal LMs with a tokenizer the LiteRT-LM bundles `model.litertlm` and
    `model_int8.litertlm` (see `kzoo.export.litertlm`; with the opt-in "litertlm_int4" also
    `model_int4.litertlm`, int4 weights in blocks of 32), and `export_report.json`. Each
    artifact is run on held-out inputs and compared with the Keras model, as its format in
    `kzoo.export.formats` says: float32 files (SavedModel, tflite_fp32, litertlm) within
    `verification.fp32_tolerance` of Keras' logits at lengths 1, 7 and the full length, with
    Keras' greedy tokens and text; quantized files within `quality_bounds[format]` nats of
    Keras' held-out cross-entropy (default `verification.QUALITY_BOUNDS`); LiteRT-LM bundles
    in the LiteRT-LM runtime itself.

    The report gives per artifact its size, max abs differences, quality
    (cross-entropy, perplexity, accuracy, top-1 agreement with Keras),
    generation agreement and median batch-1 latency (LiteRT with 2 threads).

    Everything is written to a staging folder beside `output_dir` and moved into place
    only when every check passed (`kzoo.files.atomic_folder`); on any failure the staging
    folder is removed and `ExportError` raised, so `output_dir` never holds a partial or
    unverified export. A symbolic link at `output_dir` is followed. The staging folders of an
    export that was killed (named for their host and process) are removed by the next export
    to the same path.

    Args:
        model: a kzoo task model, the path of its `.keras` file, or a causal LM checkpoint: a GGUF
            file or a preset whose package installs its weights (`smollm2_135m_instruct`). A model
            the export loads itself is let go of once the LiteRT-LM bundles' float32 file is
            converted, so that their checks run without its weights (a model passed as an object
            is the caller's, held through them).
        output_dir: the folder to create.
        formats: iterable or comma-separated string of `FORMATS`; defaults
            to `DEFAULT_FORMATS` (all but the opt-in full integer "tflite_int8").
        representative_data: a `kzoo.data.load` dataset name (e.g. "kzoo_tiny_shakespeare"),
            read with the model's tokenizer: calibration rows from its train split, held-out
            rows from validation (or test); "synthetic" for uniformly random token ids; None for
            the default: `export_data.DEFAULT_TEXT` for a causal LM with a tokenizer, else
            synthetic ids.
        tokenizer_dir: for a model that carries no tokenizer (`Task.tokenizer`,
            which the recipes set), where `kzoo.data.save_tokenizer` wrote it;
            defaults to the `.keras` file's folder. Without a tokenizer, the
            SavedModel has no text signature.
        data_dir: the tensorflow-datasets folder for `representative_data`
            (`kzoo.data.load`'s `data_dir`).
        max_length: int, the full sequence length checked; defaults to the shortest of
            `DEFAULT_CHECK_LENGTH` (256), the model's maximum (128 for models without a
            position table) and `cache_length`.
        cache_length: int, the KV cache positions of the exported files; defaults to the
            model's maximum sequence length capped at 4,096
            (`kzoo.export.serving_signatures.DEFAULT_CACHE_LENGTH`).
        num_examples: int, held-out rows (quality metrics).
        num_representative: int, calibration rows for "tflite_int8".
        generate_tokens: int, new tokens per generation check.
        latency_runs: int, timed calls per latency median.
        quality_bounds: dict `{format: nats}` overriding `verification.QUALITY_BOUNDS`: each
            format one of its keys, each bound a finite number >= 0.
        compare_model_export: bool, also measure the SavedModel of Keras'
            `model.export` (for the report; not kept).
        overwrite: bool, replace an existing non-empty `output_dir`.
        seed: int, for synthetic data and calibration sampling.
        prefill_lengths: the LiteRT-LM `prefill_<N>` chunk lengths
            (`kzoo.export.litertlm.prefill_lengths`; default 16, 64, 256 where
            they divide the cache length).
        cache_spans: "auto", ints, or "none" / None: the cache prefixes a LiteRT-LM bundle's
            attention reads instead of the whole cache (`kzoo.export.litertlm.attention_spans`):
            a step costs what its position has reached.
        ignore_memory_estimate: bool, export even where the estimated peak memory
            (`kzoo.export.memory.check_memory`, checked once the model is loaded) exceeds what the
            host has available.
        int4_rerounding: nats in [0, 1]: with "litertlm_int4", a GGUF's 5- to 8-bit weights,
            which the int4 bundle keeps in int8, go to int4 blocks by groups (the same weight of
            every block) where the export measures them to move the Keras model's next-token
            distributions by at most this much (mean KL divergence on held-out rows, the groups
            together; `kzoo.export.tflite.rerounding`): a smaller bundle for a little fidelity
            (Qwen2.5-Coder-1.5B at 0.01: 85 MB less, top-1 agreement 0.904 against 0.915). 0
            (the default): none, and nothing measured.

    Returns:
        The report (also written to `output_dir/export_report.json`).

    Raises:
        ExportError: with a message saying what is wrong; a bad setting (a format name, a count,
            a quality bound) before anything is loaded or written, an estimated peak memory beyond
            the host's available memory before anything is converted.

    Example:
    >>> backbone = kzoo.models.GPTBackbone(64, 1, 2, 16, 32, max_sequence_length=16)
    >>> report = export(kzoo.models.GPTCausalLM(backbone), "/tmp/gpt_export", "tflite_fp32", overwrite=True)
    >>> sorted(report["artifacts"])
    ['tflite_fp32']
    >>> sorted(report["artifacts"]["tflite_fp32"]["max_abs_diff"])  # the lengths checked
    ['1', '16', '7']
    >>> report["artifacts"]["tflite_fp32"]["generation"]["matches_keras"]
    True
    """
    settings = _checked_settings(
        formats=formats,
        representative_data=representative_data,
        tokenizer_dir=tokenizer_dir,
        data_dir=data_dir,
        max_length=max_length,
        cache_length=cache_length,
        num_examples=num_examples,
        num_representative=num_representative,
        generate_tokens=generate_tokens,
        latency_runs=latency_runs,
        quality_bounds=quality_bounds,
        compare_model_export=compare_model_export,
        seed=seed,
        prefill_lengths=prefill_lengths,
        cache_spans=cache_spans,
        ignore_memory_estimate=ignore_memory_estimate,
        int4_rerounding=int4_rerounding,
    )
    with _output_folder(output_dir, overwrite) as staging:
        context = Context(model, settings, staging)
        records = {}
        for i, format in enumerate(context.formats):
            if context.owns_model and not any(later.needs_keras_model for later in context.formats[i:]):
                context.release_model()
            records[format.name] = format.build(context)
        shutil.rmtree(context.work_dir, ignore_errors=True)
        failures = [failure for format in context.formats for failure in format.failures(records[format.name])]
        if failures:
            raise ExportError(
                "The export did not verify against the Keras model, so nothing was written to "
                f"{Path(output_dir).absolute()}:\n- " + "\n- ".join(failures)
            )
        report = context.report(records)
        (staging / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


class Context:
    """What the formats of one export share: the model (`path`: its `.keras` file or None),
    its task, input names and tokenizer, `export`'s `settings` by name, the `staging` folder,
    the held-out `data`, and what the Keras model gives on it. The costly parts (the traced
    signatures, Keras' generations) are computed when a format first asks for them.

    A model the export loaded itself (`owns_model`: from a path, not a model object) is let go
    once the formats left need only what was computed from it (`release_model`): the LiteRT-LM
    checks then run without the Keras model's weights beside the bundle's."""

    def __init__(self, model, settings, staging):
        self.owns_model = not isinstance(model, keras.Model)
        self.model, self.path = _load_model(model)
        self.settings, self.staging = settings, staging
        self.task = _checked(task_of, self.model)
        self.cache_length = _checked(check_cache_length, self.model, settings.cache_length)
        self.prefill_lengths = _checked(litertlm.prefill_lengths, self.cache_length, settings.prefill_lengths)
        self.cache_spans = _checked(litertlm.attention_spans, self.cache_length, settings.cache_spans)
        self.names = input_names(self.model)
        self.max_length = _check_length(settings.max_length, self.model, self.cache_length)
        self.tokenizer = getattr(self.model, "tokenizer", None)
        if self.tokenizer is None:  # a model saved before tasks carried their tokenizer: the file beside it
            folder = settings.tokenizer_dir or (self.path.parent if self.path else None)
            self.tokenizer = _load_tokenizer(folder, settings.representative_data)
        self.formats = self._applicable(settings.formats)
        self.memory = self._memory_estimate(settings.ignore_memory_estimate)
        self.data = _export_data(self, settings)
        self.model_record = self._model_record()

    def release_model(self):
        """Drops this export's references to the Keras model, after computing what the LiteRT-LM
        bundles take from it (`bundles`, which lets go of it once its float32 file is
        converted). Only for a model the export loaded (`owns_model`)."""
        if self.model is None:
            return
        if any(isinstance(format, formats_lib.LiteRTLMBundle) for format in self.formats):
            self.bundles.release_model()
        self.__dict__.pop("signatures", None)
        if "keras" in self.__dict__:
            self.keras.model = None
        self.model = None
        memory.release_freed_memory()

    def _memory_estimate(self, ignore):
        """`kzoo.export.memory.check_memory` for this export, its refusal an `ExportError` unless
        `ignore`; the estimate and the memory it was compared with, for the report."""
        return _checked(
            memory.check_memory,
            self.model,
            self.cache_length,
            self.max_length,
            formats_lib.LITERTLM_ROWS,
            vocabulary_size_of(self.model),
            ignore=ignore,
            releases_model=self.owns_model,
        )

    def _applicable(self, names):
        """The formats of `names` (None: `DEFAULT_FORMATS`); one asked for by name that cannot be
        made for this model is an error, one of the defaults is left out."""
        chosen = []
        for name in names or DEFAULT_FORMATS:
            for format in formats_lib.FORMATS[name]:
                reason = format.refusal(self)
                if reason and names:
                    raise ExportError(reason)
                if not reason:
                    chosen.append(format)
        return chosen

    @functools.cached_property
    def signatures(self):
        """`ServingSignatures`: the SavedModel's and TFLite files' functions, traced once."""
        return ServingSignatures(self.model, self.cache_length, self.tokenizer)

    @functools.cached_property
    def keras(self):
        """`KerasReference`: the Keras model's logits and quality on the held-out data."""
        return KerasReference(self.model, self.names, self.data, self.max_length)

    @functools.cached_property
    def generation(self):
        """Greedy generation cases for SavedModel and TFLite (`_generation_cases`), or None."""
        if self.task not in ("causal_lm", "seq2seq"):
            return None
        return _generation_cases(self.model, self.task, self.data, self.cache_length, self.settings.generate_tokens)

    @functools.cached_property
    def text(self):
        """The text signature's case (`_text_cases`), or None without one."""
        if self.tokenizer is None or self.task not in TEXT_SIGNATURES:
            return None
        return _text_cases(self.model, self.task, self.data, self.tokenizer, self.settings.generate_tokens)

    @functools.cached_property
    def bundles(self):
        """`litertlm.Bundles`: what the LiteRT-LM bundles share, checked on the first held-out rows."""
        rows, weights = slice(0, formats_lib.LITERTLM_ROWS), self.data.sample_weight
        return _checked(
            litertlm.Bundles,
            self.model,
            self.tokenizer,
            self.data.held_out["token_ids"][rows],
            self.keras.first_logits(formats_lib.LITERTLM_ROWS),
            self.keras.targets[rows],
            None if weights is None else weights[rows],
            cache_length=self.cache_length,
            lengths=self.prefill_lengths,
            spans=self.cache_spans,
            generate_tokens=self.settings.generate_tokens,
            num_threads=LITERT_THREADS,
            int4_rerounding=self._int4_rerounding(),
            work_dir=self.work_dir,
        )

    def _int4_rerounding(self):
        """The settings' `int4_rerounding` where an int4 bundle is made (else 0: nothing to measure)."""
        int4 = any(getattr(format, "conversion", None) == litertlm.INT4 for format in self.formats)
        return float(self.settings.int4_rerounding) if int4 else 0.0

    @property
    def work_dir(self):
        """The formats' working files (the LiteRT-LM bundles' models and caches): in the staging
        folder, so that a failed or killed export leaves none behind; removed before it is moved
        into place."""
        return self.staging / ".work"

    def _model_record(self):
        """The report's `model` entry (made while the model is loaded: `release_model`)."""
        return {
            "path": None if self.path is None else str(self.path),
            "class": type(self.model).__name__,
            "task": self.task,
            "parameters": int(self.model.count_params()),
            "vocabulary_size": int(vocabulary_size_of(self.model)),
            "max_sequence_length": getattr(getattr(self.model, "backbone", None), "max_sequence_length", None),
            "dtype_policy": self.model.dtype_policy.name,
            "cache_length": self.cache_length if self.task in ("causal_lm", "seq2seq") else None,
        }

    def report(self, records):
        """The export's report: the model, the data, the tolerances and the formats' `records`."""
        held_out, representative = self.data.held_out, self.data.representative
        return {
            "model": self.model_record,
            "data": {
                "source": self.data.source,
                "held_out_examples": len(next(iter(held_out.values()))),
                "representative_examples": len(next(iter(representative.values()))),
                "targets": "labels" if self.data.targets is not None else "the Keras model's argmax (synthetic data)",
            },
            "checked_lengths": self.keras.lengths,
            "tolerances": {
                "fp32_max_abs_diff_per_unit_logit": verification.FP32_TOLERANCE,
                "quality_bounds_nats": self.settings.quality_bounds,
            },
            # Measured where a format compares with it; a LiteRT-LM bundle's record has Keras'
            # cross-entropy on the rows it checks (`quality.keras_cross_entropy`).
            "keras": {"quality": self.keras.quality if self.keras.measured else None},
            "memory": self.memory,
            "artifacts": records,
            "environment": _environment(),
        }


class KerasReference:
    """The Keras model's outputs that every artifact is compared with: the logits of the first
    held-out rows at each checked length (`logits`), and its argmax and quality over all of them
    (`argmax`, `quality`), each computed when first asked for (a LiteRT-LM bundle needs neither,
    only `first_logits`). The held-out rows run `REFERENCE_ROWS` at a time, on the Keras model
    and on each artifact, so that one batch of logits is held at a time, not the whole held-out
    set's."""

    def __init__(self, model, names, data, length):
        self.model, self.names, self.data = model, names, data
        self.lengths = verification.checked_lengths(length)
        self.batches = [
            (self.rows(start), slice(start, start + REFERENCE_ROWS))
            for start in range(0, len(next(iter(data.held_out.values()))), REFERENCE_ROWS)
        ]
        self.batch_one = {name: value[:1] for name, value in data.held_out.items()}

    @functools.cached_property
    def compared(self):
        """The first `COMPARED_ROWS` held-out rows cropped to each checked length."""
        rows = {name: value[:COMPARED_ROWS] for name, value in self.data.held_out.items()}
        return {n: export_data.crop(rows, n) for n in self.lengths}

    @functools.cached_property
    def logits(self):
        """The Keras logits of `compared`, per checked length."""
        return {n: self.predict(inputs) for n, inputs in self.compared.items()}

    @functools.cached_property
    def _held_out(self):
        measure, argmax = verification.Quality(), []
        for inputs, cut in self.batches:
            logits = self.predict(inputs)
            argmax.append(logits.argmax(-1))
            targets = argmax[-1] if self.data.targets is None else self.data.targets[cut]
            measure.add(logits, targets, self.weights(cut))
        return np.concatenate(argmax), measure.result()

    @property
    def argmax(self):
        """The Keras model's next-token argmax at every held-out position."""
        return self._held_out[0]

    @property
    def quality(self):
        """The Keras model's quality over the held-out rows (`verification.Quality`)."""
        return self._held_out[1]

    @property
    def measured(self):
        """Whether `quality` was computed (a format asked for it)."""
        return "_held_out" in self.__dict__

    @property
    def targets(self):
        """The held-out next tokens: the labels, or the Keras argmax for synthetic rows."""
        return self.argmax if self.data.targets is None else self.data.targets

    def rows(self, start, count=REFERENCE_ROWS):
        return {name: value[start : start + count] for name, value in self.data.held_out.items()}

    def weights(self, cut):
        return None if self.data.sample_weight is None else self.data.sample_weight[cut]

    def first_logits(self, count):
        """The Keras logits of the first `count` held-out rows, at their full length, computed a
        row at a time into one array: at a real vocabulary a batch's logits are gigabytes, and
        the model's output beside its copy in NumPy held them twice."""
        count, logits = min(count, len(next(iter(self.data.held_out.values())))), None
        for i in range(count):
            row = self.predict(self.rows(i, 1))
            if logits is None:
                logits = np.empty((count, *row.shape[1:]), row.dtype)
            logits[i] = row[0]
        return logits

    def predict(self, inputs):
        try:
            return keras.ops.convert_to_numpy(call_model(self.model, self.names, inputs))
        except tf.errors.ResourceExhaustedError as error:
            rows, length = next(iter(inputs.values())).shape[:2]
            raise ExportError(
                f"The Keras model ran out of memory on {rows} held-out rows of length {length}: pass a "
                "smaller max_length (--max-length), cache_length (--cache-length) or num_examples (--num-examples)."
            ) from error

    def compare(self, predict):
        """`max_abs_diff` and its `tolerance` per checked length, and the held-out `quality`, of
        a `predict` function taking the model's inputs by name."""
        measure = verification.Quality()
        for inputs, cut in self.batches:
            measure.add(predict(inputs), self.targets[cut], self.weights(cut), self.argmax[cut])
        return {
            "max_abs_diff": {
                str(n): verification.max_abs_diff(predict(self.compared[n]), self.logits[n]) for n in self.lengths
            },
            "tolerance": {str(n): verification.fp32_tolerance(self.logits[n]) for n in self.lengths},
            "quality": measure.result(),
        }


def _generation_cases(model, task, data, cache_length, generate_tokens):
    """Two greedy generations (short and long context) and the tokens of the Keras model's
    `generate` (without XLA: the exported files run without it too)."""
    held_out = data.held_out
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


def _text_cases(model, task, data, tokenizer, generate_tokens):
    """Raw strings for the text signature (the first held-out rows, detokenized) and what the
    Keras model gives for them, tokenized and decoded in Python: probabilities, or text."""
    from kzoo.data import classification_batches

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


def _format_names(formats):
    """The format names asked for, checked and without repeats; None for the defaults."""
    if formats is None:
        return None
    if isinstance(formats, str):
        formats = formats.split(",")
    formats = [name.strip() for name in formats if name.strip()]
    unknown = [name for name in formats if name not in FORMATS]
    if unknown or not formats:
        raise ExportError(f"Unknown format(s) {unknown or formats}; choose from {', '.join(FORMATS)}.")
    return list(dict.fromkeys(formats))


def _checked_settings(**settings):
    """`export`'s settings as a namespace, after checking the format names, the quality bounds and
    the counts: a count that is given must be an int >= 1 (0 would mean "the default" or divide by
    zero)."""
    settings = types.SimpleNamespace(**settings)
    settings.formats = _format_names(settings.formats)
    settings.quality_bounds = _quality_bounds(settings.quality_bounds)
    for name in ("max_length", "cache_length", "num_examples", "num_representative", "generate_tokens", "latency_runs"):
        value = getattr(settings, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
            raise ExportError(f"`{name}` must be an int >= 1; received {name}={value!r}.")
    budget = settings.int4_rerounding
    if not _is_number(budget) or not 0 <= budget <= 1:  # NaN fails both
        raise ExportError(f"`int4_rerounding` must be a number of nats in [0, 1]; received {budget!r}.")
    return settings


def _quality_bounds(bounds):
    """`verification.QUALITY_BOUNDS` with `bounds` over them, checked before the export starts: a
    misspelt format would otherwise be ignored, and a NaN or negative bound would fail its format
    only once every file was made."""
    if bounds is None:
        return dict(verification.QUALITY_BOUNDS)
    if not isinstance(bounds, dict):
        raise ExportError(
            f"`quality_bounds` must be a dict {{format: nats}}, e.g. {{'tflite_int8': 0.2}}; received {bounds!r}."
        )
    for name, value in bounds.items():
        if name not in verification.QUALITY_BOUNDS:
            raise ExportError(
                f"`quality_bounds` names {name!r}, which has no quality bound; the quantized formats are "
                f"{', '.join(verification.QUALITY_BOUNDS)}."
            )
        if not _is_number(value) or not math.isfinite(value) or value < 0:
            raise ExportError(
                f"`quality_bounds[{name!r}]` must be a finite number of nats in [0, inf); received {value!r}."
            )
    return {**verification.QUALITY_BOUNDS, **{name: float(value) for name, value in bounds.items()}}


def _is_number(value):
    """Whether a setting is a real number (an int or a float, NumPy's too; not a bool)."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


@contextlib.contextmanager
def _output_folder(output_dir, overwrite):
    """`kzoo.files.atomic_folder` for `output_dir`, its errors as `ExportError`s."""
    try:
        with files.atomic_folder(output_dir, overwrite, hint="pass --overwrite to replace it") as staging:
            yield staging
    except files.FolderError as error:
        raise ExportError(str(error)) from error


def _checked(function, *args, **kwargs):
    """`function(*args, **kwargs)`, a ValueError raised as an `ExportError`."""
    try:
        return function(*args, **kwargs)
    except ValueError as error:
        raise ExportError(str(error)) from error


def _load_model(model):
    """`(model, path or None)`: a model, the path of a `.keras` file holding a kzoo model, or a
    causal LM's checkpoint (a GGUF file, or a preset whose package installs its weights, such
    as `smollm2_135m_instruct`), loaded with its tokenizer and chat template."""
    from kzoo.models import presets

    if isinstance(model, keras.Model):
        return model, None
    if "weights" in presets.PRESETS.get(str(model), {}) or str(model).endswith(".gguf"):
        try:
            return CausalLM.from_preset(str(model)), None
        except (OSError, ValueError) as error:
            raise ExportError(f"Could not load {model}: {error}") from error
    path = Path(model)
    if not path.is_file():
        raise ExportError(f"No model file at {path}.")
    if path.suffix != ".keras":
        raise ExportError(
            f"{path} is not a .keras file (save the model with `model.save('model.keras')`) nor a GGUF file."
        )
    if not zipfile.is_zipfile(path):
        raise ExportError(f"{path} is not a valid .keras file (not a zip archive: truncated or corrupt?).")
    try:
        return keras.saving.load_model(path), path
    except Exception as error:  # Keras raises many types for a bad archive
        raise ExportError(f"Could not load {path}: {type(error).__name__}: {error}") from error


def _check_length(max_length, model, cache_length):
    """The full length the files are checked at: `max_length`, by default the shortest of the
    model's maximum, the cache and `DEFAULT_CHECK_LENGTH`."""
    limit = getattr(getattr(model, "backbone", None), "max_sequence_length", None)
    if max_length is None:
        return min(max_length_of(model), cache_length, DEFAULT_CHECK_LENGTH)
    if limit is not None and max_length > limit:
        raise ExportError(f"`max_length` ({max_length}) must be in [1, {limit}], the model's maximum sequence length.")
    return max_length


def _load_tokenizer(directory, representative_data):
    """The tokenizer saved beside the model (`kzoo.data.save_tokenizer`), or None if there is
    none; a named `representative_data` set cannot be read without it."""
    from kzoo.data import load_tokenizer  # kzoo.data imports tensorflow-datasets: only here

    try:
        if directory is None:
            raise FileNotFoundError("a model passed as an object has no folder; pass `tokenizer_dir`")
        return load_tokenizer(directory)
    except FileNotFoundError as error:
        if representative_data in (None, export_data.SYNTHETIC):
            return None
        raise ExportError(
            f"Representative data {representative_data!r} needs the model's tokenizer: {error}"
        ) from error
    except (ValueError, TypeError, KeyError) as error:  # a corrupt tokenizer.json (JSONDecodeError is a ValueError)
        raise ExportError(
            f"Cannot read the tokenizer saved beside the model in {directory}: {type(error).__name__}: {error}"
        ) from error


def _export_data(context, settings):
    """The held-out and calibration rows: `representative_data`, by default text for a causal LM
    with a tokenizer (`export_data.DEFAULT_TEXT`, or synthetic ids where its corpus is not
    installed: the data's `source` says so), synthetic ids for other models."""
    name, vocabulary_size = settings.representative_data, vocabulary_size_of(context.model)
    counts = (context.max_length, settings.num_examples, settings.num_representative, settings.seed)
    default = name is None
    if default:
        text = context.task == "causal_lm" and context.tokenizer is not None
        name = export_data.DEFAULT_TEXT if text else export_data.SYNTHETIC
    if name == export_data.SYNTHETIC:
        return export_data.synthetic_data(context.names, vocabulary_size, *counts)
    try:
        if default:
            return export_data.text_data(context.tokenizer, context.names, *counts)
        return export_data.dataset_data(
            name, context.tokenizer, context.task, context.names, vocabulary_size, *counts, settings.data_dir
        )
    except FileNotFoundError as error:
        if not default:
            raise ExportError(f"Cannot read representative data {name!r}: {error}") from error
        data = export_data.synthetic_data(context.names, vocabulary_size, *counts)
        data.source += f" ({name}, the default text, is not installed: {error})"
        return data
    except (ValueError, StopIteration) as error:
        raise ExportError(f"Cannot read representative data {name!r}: {error}") from error


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
