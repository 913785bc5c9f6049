"""A bundle checked in the LiteRT-LM runtime against its Keras model: `Bundles`."""

import mmap
import tempfile
import time
from pathlib import Path

import numpy as np

from kzoo import logs
from kzoo.export import litertlm_model
from kzoo.export import memory
from kzoo.export import verification
from kzoo.export.litertlm.bundle import CONVERSIONS
from kzoo.export.litertlm.bundle import llm_metadata
from kzoo.export.litertlm.bundle import runtime_chat_template
from kzoo.export.litertlm.bundle import write_bundle
from kzoo.export.litertlm.signatures import TEACHER_FORCED
from kzoo.export.litertlm.signatures import RuntimeSignatures
from kzoo.export.litertlm.signatures import attention_spans
from kzoo.export.litertlm.signatures import prefill_lengths
from kzoo.export.tflite import graph_passes
from kzoo.export.tflite import placeholders
from kzoo.export.tflite import rerounding
from kzoo.export.tflite.graph_passes import op_census
from kzoo.export.tflite.quantize import INT4
from kzoo.export.tflite.quantize import quantize_file

# The positions of one row the bundle's `decode` signature computes in each check, beside the
# rows' logits computed a chunk at a time (`Bundles`).
DECODE_CHECKED = 16


class Bundles:
    """The LiteRT-LM bundles of one model: `write` makes one and measures it in the runtime.

    What they share is made once: the signatures, the tokenizer (`kzoo.tokenizers.tokenizer_json`)
    and the Keras model's greedy texts. In LiteRT-LM, the runtime's tokenizer must give the
    Keras tokenizer's ids for each prompt, and its greedy text (`top_k=1`) is compared with
    Keras' greedy `generate` on a one-token prompt, a short one and one longer than the largest
    prefill chunk where the cache allows; the next-token logits of the bundle's model over
    held-out rows are compared with Keras': computed a chunk at a time by a `TEACHER_FORCED`
    signature that the file checked has and the bundle does not (a row's logits token by token
    read the weights once per position: at 1.5B parameters, most of an export's time), and by
    `decode` at the first `DECODE_CHECKED` positions of the first row. The caller decides which results
    pass (`kzoo.export.formats.LiteRTLMBundle`).

    Args:
        model: a `GPTCausalLM` (a task with the serving interface and `generate`).
        tokenizer: its keras-hub tokenizer (one `kzoo.tokenizers.tokenizer_json` writes).
        token_ids: int `(N, T)`, held-out rows (T at least the cache length, or all of it).
        logits: float `(N, T, V)`, the Keras model's logits for them.
        targets: int `(N, T)`, the next tokens (or the Keras argmax for synthetic rows).
        sample_weight: `(N, T)` or None.
        cache_length: int, the bundles' `max_num_tokens`.
        lengths: the prefill chunk lengths (`prefill_lengths`).
        spans: the cache spans of the bundles' attention (`attention_spans`); None for none.
        generate_tokens: int, new tokens per greedy check.
        num_threads: int, the runtime's CPU threads.
        int4_rerounding: nats, `rerounding.choose`'s budget for an `INT4` bundle: its
            finer-source weights to re-round are measured now, while the Keras model is here;
            0 for none (nothing measured).
        work_dir: a folder for the bundles' working files (the float32 TFLite model, each
            quantized one while its bundle is checked, the runtimes' packed-weight caches, the
            Keras logits of the checked rows); the caller removes it (the exporter's is in its
            staging folder).

    The models are kept in files, not in memory: LiteRT and LiteRT-LM map them, and pack their
    weights into caches in files (mapped too), so that a check holds the Keras model and about
    one copy of the bundle's weights, which the kernel can page out, rather than several; each
    row's logits are compared as LiteRT computes them, against Keras' read from a file.
    """

    def __init__(
        self,
        model,
        tokenizer,
        token_ids,
        logits,
        targets,
        sample_weight=None,
        *,
        cache_length,
        lengths=None,
        spans=None,
        generate_tokens=32,
        num_threads=2,
        int4_rerounding=0.0,
        work_dir,
    ):
        from kzoo.tokenizers.tokenizer_json import hugging_face_tokenizer  # keras-hub, tokenizers: only here

        self.exported = hugging_face_tokenizer(tokenizer)
        self.cache_length = cache_length
        self.prefill_lengths = prefill_lengths(cache_length, lengths)
        self.spans = attention_spans(cache_length, spans)
        # Traced only when the float32 file is converted from placeholders
        # (`placeholders.converted`): the same file, without the converter's copies of the weights.
        self.positions = min(cache_length, token_ids.shape[1])
        # The rows' logits a chunk at a time (`TEACHER_FORCED`), in the float32 file and those
        # quantized from it, never in a bundle (`_shipped`); `decode` checked on one row's first
        # `DECODE_CHECKED` positions.
        self.check_length = min(self.positions, self.prefill_lengths[-1])
        self._trace = lambda: RuntimeSignatures(model, cache_length, lengths, spans, check_length=self.check_length)
        self._model, self._release = model, False
        chat_template = self.exported.chat_template and runtime_chat_template(
            self.exported.chat_template, getattr(tokenizer, "special_tokens_map", {}), self.exported.start_token_id
        )
        self.metadata = llm_metadata(
            cache_length, self.exported.stop_token_ids, self.exported.start_token_id, chat_template=chat_template
        )
        self.cases = _generation_cases(
            model, tokenizer, token_ids, cache_length, self.prefill_lengths, self.exported, generate_tokens
        )
        cut = slice(0, self.positions)
        self.token_ids, self.targets = token_ids[:, cut], targets[:, cut]
        self.weights = None if sample_weight is None else sample_weight[:, cut]
        logits = logits[:, cut]
        self.keras_cross_entropy = verification.quality(logits, self.targets, self.weights)["cross_entropy"]
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.rerounding = None
        if int4_rerounding > 0:
            self.rerounding = rerounding.choose(
                model, self.token_ids, logits, self.weights, int4_rerounding, work_dir=self.work_dir
            )
        self.tolerance = verification.fp32_tolerance(logits)
        self.num_threads = num_threads
        self._float32 = self.work_dir / "float32.tflite"
        # Kept in a file and read a row at a time by each check (`_keras_row`): at Qwen2.5's
        # vocabulary the rows' logits are 1.2 GB, which the process held through every check.
        self._keras_logits = self.work_dir / "keras_logits.npy"
        np.save(self._keras_logits, logits)

    def write(self, path, conversion):
        """Writes the bundle `path`, its model made as `conversion` (a key of `CONVERSIONS`),
        and checks it.

        Returns:
            The record: the file's `path` (its name), `size_bytes`, `tflite_bytes`,
            `description`, `prefill_lengths`, `max_num_tokens`, `export_seconds`, `ops`,
            `max_abs_diff` and `tolerance` and `quality` (over the reference rows), `checked_rows`,
            `tokenizer` and `generation` (`matches_keras`, `token_agreement` and the cases),
            `latency_ms`, and for `INT4` `int4_rerounded` (`rerounding.choose`'s measurements).
        """
        start = time.perf_counter()
        if not self._float32.exists():  # converted once, quantized per bundle
            sizes = (self.cache_length, *self.prefill_lengths, *self.spans, self.check_length)
            placeholders.converted(self._model, self._trace, sizes, path=self._float32)
            if self._release:
                self.release_model()
        model_file = self._float32 if conversion == "tflite_fp32" else self.work_dir / f"{conversion}.tflite"
        shipped = self.work_dir / f"{conversion}.shipped.tflite"
        try:
            if model_file != self._float32:
                chosen = self.rerounding["fingerprints"] if conversion == INT4 and self.rerounding else ()
                found = quantize_file(self._float32, conversion, model_file, chosen)
            _shipped(model_file, shipped)
            memory.release_freed_memory()  # the converter's or the quantizer's, before LiteRT loads the model
            write_bundle(path, shipped, self.exported.tokenizer.to_str(), self.metadata)
            tflite_bytes, ops = shipped.stat().st_size, _op_census(shipped)
            shipped.unlink()
            seconds = time.perf_counter() - start
            measure, largest = verification.Quality(), 0.0
            with (
                logs.captured_stderr(),
                litertlm_model.compiled_model(model_file, self.num_threads, self.work_dir) as runs,
            ):
                rows = litertlm_model.chunked_rows(runs, self.token_ids, TEACHER_FORCED)
                for i, logits in enumerate(rows):  # one row's logits and Keras' at a time
                    reference = self._keras_row(i)
                    largest = max(largest, verification.max_abs_diff(logits, reference))
                    weights = None if self.weights is None else self.weights[i]
                    measure.add(logits, self.targets[i], weights, reference.argmax(-1))
                    del logits, reference
                decoded = self.token_ids[:1, :DECODE_CHECKED]
                (logits,) = litertlm_model.decoded_rows(runs, decoded)
                largest = max(largest, verification.max_abs_diff(logits, self._keras_row(0)[: decoded.shape[1]]))
        finally:
            shipped.unlink(missing_ok=True)
            if model_file != self._float32:
                model_file.unlink(missing_ok=True)
        quality = measure.result()
        quality["keras_cross_entropy"] = self.keras_cross_entropy
        quality["cross_entropy_increase"] = quality["cross_entropy"] - self.keras_cross_entropy
        record = {
            "path": path.name,
            "size_bytes": path.stat().st_size,
            "tflite_bytes": tflite_bytes,
            "description": CONVERSIONS[conversion],
            "prefill_lengths": list(self.prefill_lengths),
            "cache_spans": self.spans,
            "max_num_tokens": self.cache_length,
            "export_seconds": round(seconds, 2),
            "ops": ops,
            "max_abs_diff": {str(self.positions): largest},
            "tolerance": {str(self.positions): self.tolerance},
            "quality": quality,
            "checked_rows": len(self.token_ids),
        }
        if conversion == INT4 and self.rerounding:
            record["int4_rerounded"] = {key: value for key, value in self.rerounding.items() if key != "fingerprints"}
            # The weights chosen and those the file holds in int4 blocks: fewer where the converter
            # folded a scale into one (it stays int8).
            record["int4_rerounded"]["weights"] = {"chosen": len(chosen), "in_file": found}
        with tempfile.TemporaryDirectory(dir=self.work_dir) as cache:
            runtime = litertlm_model.LiteRTLMModel(path, self.num_threads, cache_dir=cache)
            try:
                record.update(_run_cases(runtime, self.cases))
            finally:
                runtime.close()
        return record

    def release_model(self):
        """Lets go of the Keras model once the float32 file is converted (now, if it is): the
        checks need only what was computed from it, and a caller that holds no other reference
        (the exporter, when it loaded the model) gets its memory back before LiteRT maps the
        bundles' weights."""
        self._release = True
        if self._float32.exists():
            self._model = self._trace = None
            memory.release_freed_memory()

    def _keras_row(self, i):
        """The Keras logits of checked row `i`, `(positions, V)`, read from their file (mapped only
        while read)."""
        return np.array(np.load(self._keras_logits, mmap_mode="r")[i])


def _shipped(source, destination):
    """Writes the TFLite file `source` to `destination` without its `TEACHER_FORCED` signature:
    the bundle's model (`graph_passes.rewrite_file`: no copy of its weights held)."""
    graph_passes.rewrite_file(
        source, destination, lambda model: graph_passes.without_signatures(model, [TEACHER_FORCED])
    )


def _op_census(path):
    """`op_census` of the TFLite file `path`, read through a mapping of it."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        return op_census(mapped)


def _generation_cases(model, tokenizer, rows, cache_length, prefill_lengths, exported, generate_tokens):
    """Prompts (text and ids) and the Keras model's greedy continuation of each as text.

    Lengths: 1, 7 and, where the cache leaves room, longer than the largest prefill chunk;
    each cut from a held-out row, detokenized and tokenized again (the text is what the
    runtime gets)."""
    new_tokens = max(1, min(generate_tokens, cache_length // 4))
    longest = cache_length - new_tokens
    lengths = sorted({1, min(7, longest), min(2 * prefill_lengths[-1] + 3, longest)})
    start = [exported.start_token_id] if exported.start_token_id is not None else []
    cases = []
    for i, length in enumerate(lengths):
        cut = rows[i % len(rows)][:length]
        while True:  # detokenized and tokenized again, a cut can grow (subwords): cut it shorter
            text = _runtime_text(tokenizer.detokenize(cut))
            ids = [int(token) for token in np.asarray(tokenizer(text))]
            if len(cut) <= 1 or len(start) + len(ids) <= longest:
                break
            cut = cut[: max(1, len(cut) - (len(start) + len(ids) - longest))]
        new = min(new_tokens, cache_length - len(start) - len(ids))
        cases.append({"prompt": text, "prompt_ids": ids, "new_tokens": new})
    # One prompt at a time: a ragged batch steps every row a token at a time from the shortest
    # prompt's end, so beside the one-token prompt the longest prompt would be read in decode
    # steps of the whole batch, one per token, instead of in one prefill.
    prompts = [start + case["prompt_ids"] for case in cases]
    outputs = [
        model.generate(
            [prompt],
            max_length=len(prompt) + case["new_tokens"],
            stop_token_ids=exported.stop_token_ids,
            jit_compile=False,
        )[0]
        for prompt, case in zip(prompts, cases)
    ]
    for prompt, case, output in zip(prompts, cases, outputs):
        generated = output[len(prompt) : len(prompt) + case["new_tokens"]]
        if generated and generated[-1] in exported.stop_token_ids:
            generated = generated[:-1]  # the runtime does not return the stop token
        case["keras"] = _runtime_text(tokenizer.detokenize(generated)) if generated else ""
    return cases


def _runtime_text(text):
    """Detokenized text as LiteRT-LM passes it: decoded leniently (`verification.text`), and
    without NUL, since the runtime's C API hands strings over NUL-terminated."""
    return verification.text(text).replace("\x00", "")


def _run_cases(runtime, cases):
    """The runtime's tokenization and greedy text for each case, against Keras'."""
    tokenizer_matches, results, decode_rates = True, [], []
    generated_ids, reference_ids = [], []
    for case in cases:
        runtime_ids = runtime.tokenize(case["prompt"])
        tokenizer_matches &= runtime_ids == case["prompt_ids"]
        text, timing = runtime.timed_generate(case["prompt"], case["new_tokens"], top_k=1)
        results.append(
            {
                "prompt_tokens": len(case["prompt_ids"]),
                "new_tokens": case["new_tokens"],
                "keras": case["keras"],
                "litertlm": text,
            }
        )
        # Both texts tokenized again: a lenient decode's U+FFFD hides which ids gave it.
        generated_ids.append(runtime.tokenize(text) if text else [])
        reference_ids.append(runtime.tokenize(case["keras"]) if case["keras"] else [])
        if timing["decode_tokens_per_second"] > 0:
            decode_rates.append((timing["decode_tokens"], timing["decode_tokens_per_second"]))
    agreement = verification.compare_generations(generated_ids, reference_ids, [0] * len(cases))
    record = {
        "tokenizer": {"matches_keras": bool(tokenizer_matches)},
        "generation": {
            "matches_keras": all(r["keras"] == r["litertlm"] for r in results),
            "token_agreement": agreement["token_agreement"],
            "cases": results,
        },
        "latency_ms": {},
    }
    if decode_rates:
        _, rate = max(decode_rates)  # the longest generation
        record["latency_ms"]["decode_step"] = 1000 / rate
    return record
