"""LiteRT-LM bundles (`.litertlm`) of kzoo causal language models, verified in the runtime.

A bundle, packed with `litert-lm-builder`, holds three sections:

- the TFLite model in the runtime's conventions (read from LiteRT-LM's sources,
  `runtime/executor/llm_litert_compiled_model_executor.cc` and
  `litert_compiled_model_executor_utils.cc`): signatures `prefill_<N>` for a few chunk lengths
  N and `decode`; inputs `tokens` `(1, N)` int32 and `input_pos` `(N,)` int32 (the "PyTorch,
  CPU only" signature: no mask input, the model masks causally itself); the KV cache as
  `kv_cache_k_<i>` / `kv_cache_v_<i>`, inputs and outputs of the same names (the runtime
  hands the outputs of one call to the next, on the CPU in the same buffers); `decode` returns
  `logits` `(1, 1, V)`; batch 1. The cache keeps kzoo's head-major layout
  `(1, heads, cache_length, head_dim)`: the CPU runtime never looks inside it.
- the tokenizer as a Hugging Face `tokenizer.json` (`kzoo.data.tokenizer_json`);
- `LlmMetadata`: start token, stop tokens, `max_num_tokens` (the cache length), the
  default sampler and, for a tokenizer with a chat template, that template as the runtime's
  conversations render it (`runtime_chat_template`).

How the runtime prefills: it splits a prompt of L tokens into chunks, the largest
`prefill_<N>` while at least N tokens remain, then the smallest N that holds the rest; it
keeps each chunk's last token back for the next chunk (or for `decode`); it fills the unused
slots of a chunk with token 0 at position 0. `prefill_<N>` therefore writes its N slots at
`input_pos[0]` (the padding lands on positions after the prompt, which later tokens
overwrite before anything attends to them), and the largest N divides the cache length, so
no chunk of a prompt that fits ever runs past the cache. A chunk that would (only possible
when a session prefills a second time, near the end of the cache) fails in the runtime
instead of silently overwriting the cache.
"""

import contextlib
import dataclasses
import io
import json
import numbers
import tempfile
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from kzoo import files
from kzoo import logs
from kzoo.export import litertlm_model
from kzoo.export import verification
from kzoo.export.serving_signatures import state_specs
from kzoo.export.tflite_conversion import TFLITE_FORMATS
from kzoo.export.tflite_conversion import convert
from kzoo.export.tflite_conversion import op_census
from kzoo.layers import cache_spans
from kzoo.layers.multi_head_attention import one_row_as_is
from kzoo.models import TiedLogits

# How a bundle's model is made: float32 converted (`tflite_conversion.convert`), and for the
# quantized bundles then quantized by Google's ai-edge-quantizer with the recipe named, as
# litert-torch quantizes its bundles (`quantize`). Its int8 is also the more exact: on SmolLM2,
# TensorFlow's dynamic-range int8 raised the held-out cross-entropy 25 times as much (BENCHMARKS.md).
INT8, INT4 = "int8_channelwise", "int4_blockwise32"
INT4_BLOCK = 32
CONVERSIONS = {
    "tflite_fp32": TFLITE_FORMATS["tflite_fp32"],
    INT8: "int8 weights with a scale per output channel, float32 activations quantized per call "
    "(ai-edge-quantizer's dynamic_wi8_afp32)",
    INT4: f"int4 weights in blocks of {INT4_BLOCK} along each input dimension, float32 activations quantized per "
    "call (ai-edge-quantizer's dynamic_wi4b32_afp32)",
}
_RECIPES = {INT8: "dynamic_wi8_afp32", INT4: "dynamic_wi4b32_afp32"}

# Prefill chunk lengths, of which those that divide the cache length are used.
DEFAULT_PREFILL_LENGTHS = (16, 64, 256)


def prefill_lengths(cache_length, lengths=None):
    """The `prefill_<N>` chunk lengths of a bundle with `cache_length` positions.

    Args:
        cache_length: int.
        lengths: None for those of `DEFAULT_PREFILL_LENGTHS` that divide `cache_length`
            (else its largest divisor up to 64), or ints in `[1, cache_length]` whose largest
            divides `cache_length`.

    Returns:
        A sorted tuple of ints.
    """
    if lengths is None:
        lengths = [n for n in DEFAULT_PREFILL_LENGTHS if cache_length % n == 0]
        lengths = lengths or [max(n for n in range(1, 65) if cache_length % n == 0)]
    lengths = tuple(sorted({int(n) for n in lengths}))
    if not lengths or not 1 <= lengths[0] <= lengths[-1] <= cache_length or cache_length % lengths[-1]:
        raise ValueError(
            f"Prefill lengths must be in [1, {cache_length}] with the largest dividing the cache length "
            f"{cache_length}; received {list(lengths)}."
        )
    return lengths


class RuntimeSignatures:
    """A causal LM's `prefill_<N>` and `decode` in LiteRT-LM's conventions (see the module docstring).

    Built on the task's serving interface (`kzoo.models.generation`): every signature is
    `model.decode` on the state, whose `key_cache_<i>` / `value_cache_<i>` entries take the
    runtime's names `kv_cache_k_<i>` / `kv_cache_v_<i>`. The attributes
    `tflite_conversion.convert` reads (`tflite_functions`, `variables`, `tied_embeddings`)
    make it convertible like `ServingSignatures`.

    Args:
        model: a task with the serving interface and no context besides the prompt (a
            `GPTCausalLM`).
        cache_length: int, the KV cache positions: the bundle's `max_num_tokens`.
        lengths: the prefill chunk lengths (`prefill_lengths`).
        spans: the cache spans its attention may read (`attention_spans`); None for none.
    """

    # No `kzoo_model` metadata entry: the bundle's LlmMetadata describes the model.
    info = None

    def __init__(self, model, cache_length, lengths=None, spans=None):
        self.cache_length = cache_length
        self.prefill_lengths = prefill_lengths(cache_length, lengths)
        self.spans = attention_spans(cache_length, spans)
        self.tied_embeddings = any(isinstance(layer, TiedLogits) for layer in model.layers)
        prefill = tf.function(
            lambda tokens: model.prefill(tokens, cache_length)[1], input_signature=[tf.TensorSpec([1, None], tf.int32)]
        )
        names, specs = [], []
        for spec in state_specs(prefill):
            names.append(spec.name)
            specs.append(tf.TensorSpec(spec.shape, spec.dtype, name=runtime_name(spec.name)))
        self._functions = [_prefill(model, n, cache_length, names, specs) for n in self.prefill_lengths]
        self._functions.append(_decode(model, names, specs))
        self._concrete = []
        for function, queries in zip(self._functions, [*self.prefill_lengths, 1]):  # decode: one token
            # Without spans, the whole cache as before them (sliding-window layers too).
            spans = cache_spans(self.spans, max_queries=queries) if self.spans else contextlib.nullcontext()
            with spans, one_row_as_is():
                self._concrete.append(function.get_concrete_function())
        seen = set()
        self.variables = [v for f in self._concrete for v in f.variables if id(v) not in seen and not seen.add(id(v))]

    def tflite_functions(self, generation=True):
        return self._concrete


def attention_spans(cache_length, spans):
    """The cache prefixes a bundle's attention may read instead of the whole cache
    (`kzoo.layers.cache_spans`).

    The runtime hands every call the whole cache, and LiteRT's attention over it packs all its
    keys and values, written or not: at 2,048 slots, most of a SmolLM2 step's time beyond its
    weights. With spans, a step reads the first span that holds its positions (a TFLite `IF`
    per layer, the largest span outermost), so it costs what the position has reached; a
    sliding-window layer reads at most its window. Past the largest span a step runs as without
    spans (measured: SmolLM2's attention at 2,048 slots, BENCHMARKS.md). Slicing the cache to the
    exact position instead makes shapes known only at run time, which cost LiteRT-LM more per
    call than the whole attention.

    Args:
        cache_length: int.
        spans: "auto" for halves of `cache_length` down to a sixteenth or 16 slots, ints in
            `[1, cache_length)`, or None, "none" or empty for none.

    Returns:
        A sorted list of ints.
    """
    if spans is None or spans == "none" or (isinstance(spans, (list, tuple)) and not spans):
        return []
    if spans == "auto":
        return [cache_length >> k for k in range(4, 0, -1) if cache_length >> k >= 16]
    integers = not isinstance(spans, str) and all(
        isinstance(n, numbers.Integral) and not isinstance(n, bool) for n in spans
    )
    values = sorted({int(n) for n in spans}) if integers else []
    if not values or values[0] < 1 or values[-1] >= cache_length:
        raise ValueError(
            f'`cache_spans` must be "auto", "none" (or None) or ints in [1, {cache_length - 1}] (below the '
            f"cache length {cache_length}); received {spans!r}."
        )
    return values


def runtime_name(name):
    """A state entry's name in the runtime: `key_cache_3` -> `kv_cache_k_3`."""
    kind, _, index = name.rpartition("_cache_")
    return f"kv_cache_{kind[0]}_{index}"


def _step(model, tokens, index, names, cache):
    """`model.decode` on the cache tensors of the state entries `names`: `(logits, {runtime
    name: tensor})`."""
    logits, state = model.decode(tokens, dict(zip(names, cache)), index)
    return logits, {runtime_name(name): tensor for name, tensor in state.items()}


def _prefill(model, length, cache_length, names, cache_specs):
    def prefill(tokens, input_pos, *cache):
        # A slice of [0, cache_length) at the chunk's start: a chunk that would run past the
        # cache fails here, where the cache update would silently clamp its start.
        start = tf.slice(tf.range(cache_length), input_pos[:1], [length])[0]
        return _step(model, tokens, start, names, cache)[1]

    prefill.__name__ = f"prefill_{length}"  # the signature's name in the TFLite file
    specs = [tf.TensorSpec([1, length], tf.int32, name="tokens"), tf.TensorSpec([length], tf.int32, name="input_pos")]
    return tf.function(prefill, input_signature=[*specs, *cache_specs])


def _decode(model, names, cache_specs):
    # Traced for a token count unknown to Keras, the step takes the same path as a prefill
    # chunk, so the converter derives the same constants from the weights for both and
    # stores them once (a one-token step otherwise multiplies by the query, key and value
    # kernels side by side, a second, fused copy of them). The converter's shape inference
    # then makes every shape static again.
    step_specs = [tf.TensorSpec([1, None], tf.int32), tf.TensorSpec([], tf.int32), *cache_specs]

    @tf.function(input_signature=step_specs)
    def step(tokens, index, *cache):
        return _step(model, tokens, index, names, cache)

    def decode(tokens, input_pos, *cache):
        logits, cache = step(tokens, input_pos[0], *cache)
        return {"logits": tf.ensure_shape(logits, [1, 1, logits.shape[-1]]), **cache}  # (1, 1, V)

    specs = [tf.TensorSpec([1, 1], tf.int32, name="tokens"), tf.TensorSpec([1], tf.int32, name="input_pos")]
    return tf.function(decode, input_signature=[*specs, *cache_specs])


# Put before a checkpoint's chat template in a bundle: LiteRT-LM (0.18) hands the template each
# message's content as typed parts, `[{"type": "text", "text": ...}]`, where checkpoints' templates
# read a string; this joins the text parts back into one string first.
_STRING_CONTENT = (
    "{%- set kzoo_ns = namespace(messages=[]) -%}"
    "{%- for message in messages -%}"
    "{%- if message.content is string or message.content is not defined -%}"
    "{%- set kzoo_ns.messages = kzoo_ns.messages + [message] -%}"
    "{%- else -%}"
    "{%- set kzoo_ns.messages = kzoo_ns.messages"
    ' + [dict(message, content=message.content | map(attribute="text") | join)] -%}'
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- set messages = kzoo_ns.messages %}"
)


def runtime_chat_template(chat_template, special_tokens, start_token_id=None):
    """A checkpoint's Jinja chat template as a bundle carries it (`jinja_prompt_template`), so
    that LiteRT-LM's conversations render the prompt text transformers' `apply_chat_template`
    renders.

    The runtime renders with messages whose content is a list of typed parts and without the
    tokenizer's special tokens; the template gets a preamble that turns the content back into
    a string and defines the special tokens (`bos_token` only for a bundle without a start
    token: with one, the runtime puts its id before the prompt itself, and a template that
    writes `bos_token` renders without it, as in Google's own bundles).

    Args:
        chat_template: str, the Jinja template.
        special_tokens: dict, e.g. `{"bos_token": "<s>", "eos_token": "</s>"}`.
        start_token_id: the bundle's start token id, or None.
    """
    defined = "".join(
        f"{{%- set {name} = {json.dumps(str(token))} -%}}"
        for name, token in sorted(special_tokens.items())
        if token is not None and name.isidentifier() and not (name == "bos_token" and start_token_id is not None)
    )
    return defined + _STRING_CONTENT + chat_template


def bundle_model(signatures, conversion):
    """The TFLite model of a bundle: `signatures` (`RuntimeSignatures`) made as `conversion`, a
    key of `CONVERSIONS`."""
    flatbuffer = convert(signatures, "tflite_fp32")
    return flatbuffer if conversion == "tflite_fp32" else quantize(flatbuffer, conversion)


def quantize(flatbuffer, conversion):
    """The float32 TFLite model `flatbuffer` quantized by ai-edge-quantizer as `conversion` says
    (`INT8` or `INT4`), its table lookups first made EMBEDDING_LOOKUP ops (`embedding_lookups`)."""
    import ai_edge_quantizer
    from ai_edge_quantizer import recipe

    quantizer = ai_edge_quantizer.Quantizer(embedding_lookups(flatbuffer), getattr(recipe, _RECIPES[conversion])())
    # It prints a size summary and progress bars.
    with logs.captured_stderr(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return bytes(quantizer.quantize().quantized_model)


def embedding_lookups(flatbuffer):
    """The TFLite model `flatbuffer` with its table lookups as EMBEDDING_LOOKUP ops: each GATHER
    of rows (axis 0) of a constant 2-D table by 1-D ids. The two compute the same; the quantizer
    stores an EMBEDDING_LOOKUP's table in int4, and leaves a GATHER's in float32, where a tied
    table would stay in float32 beside its int4 copy (the output layer's), larger than the int8 file."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(flatbuffer, 0)
    gathers = {
        index
        for index, code in enumerate(model.operatorCodes)
        if max(code.builtinCode, code.deprecatedBuiltinCode) == schema.BuiltinOperator.GATHER
    }
    lookup = schema.OperatorCodeT()
    lookup.builtinCode = lookup.deprecatedBuiltinCode = schema.BuiltinOperator.EMBEDDING_LOOKUP
    lookup.version = 1
    model.operatorCodes.append(lookup)
    for subgraph in model.subgraphs:
        for op in subgraph.operators:
            if op.opcodeIndex not in gathers:
                continue
            table, ids = (subgraph.tensors[index] for index in op.inputs)
            options = op.builtinOptions
            if (
                model.buffers[table.buffer].data is not None
                and len(table.shape) == 2
                and len(ids.shape) == 1
                and options.axis == 0
                and options.batchDims == 0
            ):
                op.opcodeIndex = len(model.operatorCodes) - 1
                op.inputs = [op.inputs[1], op.inputs[0]]  # EMBEDDING_LOOKUP(ids, table)
                op.builtinOptionsType, op.builtinOptions = schema.BuiltinOptions.NONE, None
    builder = flatbuffers.Builder(len(flatbuffer) + 1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def int4_problem(model):
    """Why `model`'s weights cannot be cut into int4 blocks, or None: every input dimension of
    its weight matrices (the width, the feed-forward width and the heads' width) must be a
    multiple of `INT4_BLOCK`."""
    backbone = model.backbone
    dimensions = {
        "hidden_dim": backbone.hidden_dim,
        "intermediate_dim": backbone.intermediate_dim,
        "num_heads x head_dim": backbone.num_heads * backbone.head_dim,
    }
    bad = {name: size for name, size in dimensions.items() if size % INT4_BLOCK}
    if not bad:
        return None
    sizes = ", ".join(f"{name} = {size}" for name, size in bad.items())
    return f"its weights are cut into blocks of {INT4_BLOCK}, and {sizes} is not a multiple of {INT4_BLOCK}"


@dataclasses.dataclass
class Sampler:
    """A bundle's default sampler (LiteRT-LM's `SamplerParameters`): `type` "GREEDY",
    "TOP_K" or "TOP_P", with `k`, `p`, `temperature` and `seed`. The default, top-k with
    k = 5, is near-greedy, as `recipes/gpt_lm.py` samples.

    The runtime's CPU sampler is its TOP_P one, top-k then top-p: a bundle whose default is
    TOP_K or GREEDY fails in every caller that takes the bundle's sampler ("Sampler type not
    implemented yet": Google's command-line tool, its benchmark) and works only where the
    caller sets one. `llm_metadata` writes them as TOP_P: top-k as p = 1, greedy as k = 1."""

    type: str = "TOP_K"
    k: int = 5
    p: float = 1.0
    temperature: float = 1.0
    seed: int = 0


def llm_metadata(max_num_tokens, stop_token_ids, start_token_id=None, sampler=None, chat_template=None):
    """The bundle's `LlmMetadata` proto.

    Args:
        max_num_tokens: int, prompt and generated tokens together (the cache length).
        stop_token_ids: non-empty list of ints (the runtime refuses a bundle without one).
        start_token_id: int put before every prompt, or None.
        sampler: a `Sampler`, by default top-k with k = 5 (written as the runtime's TOP_P).
        chat_template: the tokenizer's Jinja chat template (`jinja_prompt_template`, which the
            runtime's conversations render messages with), or None.
    """
    from litert_lm_builder.runtime.proto import llm_metadata_pb2
    from litert_lm_builder.runtime.proto import sampler_params_pb2

    if not stop_token_ids:
        raise ValueError("A LiteRT-LM bundle needs at least one stop token id.")
    sampler = sampler or Sampler()
    metadata = llm_metadata_pb2.LlmMetadata(max_num_tokens=int(max_num_tokens))
    if chat_template:
        metadata.jinja_prompt_template = chat_template
    if start_token_id is not None:
        metadata.start_token.token_ids.ids.append(int(start_token_id))
    for token in stop_token_ids:
        metadata.stop_tokens.add().token_ids.ids.append(int(token))
    if sampler.type not in ("GREEDY", "TOP_K", "TOP_P"):
        raise ValueError(f"Unknown sampler type {sampler.type!r}; known: 'GREEDY', 'TOP_K', 'TOP_P'.")
    parameters = metadata.sampler_params
    parameters.type = sampler_params_pb2.SamplerParameters.TOP_P
    parameters.k = 1 if sampler.type == "GREEDY" else sampler.k
    parameters.p = sampler.p if sampler.type == "TOP_P" else 1.0
    parameters.temperature, parameters.seed = sampler.temperature, sampler.seed
    return metadata


def write_bundle(path, tflite_model, tokenizer_json, metadata):
    """Packs a `.litertlm` file with litert-lm-builder.

    Args:
        path: the file to write.
        tflite_model: bytes, the TFLite model (`RuntimeSignatures` converted).
        tokenizer_json: str, the Hugging Face `tokenizer.json` text.
        metadata: the `LlmMetadata` proto (`llm_metadata`).
    """
    from litert_lm_builder import litertlm_builder

    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        (folder / "model.tflite").write_bytes(tflite_model)
        (folder / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
        (folder / "llm_metadata.pb").write_bytes(metadata.SerializeToString())
        builder = litertlm_builder.LitertLmFileBuilder()
        builder.add_tflite_model(str(folder / "model.tflite"), litertlm_builder.TfLiteModelType.PREFILL_DECODE)
        builder.add_hf_tokenizer(str(folder / "tokenizer.json"))
        builder.add_llm_metadata(str(folder / "llm_metadata.pb"))
        with files.atomic_file(path) as file:  # whole, or not at all
            builder.build(file)


class Bundles:
    """The LiteRT-LM bundles of one model: `write` makes one and measures it in the runtime.

    What they share is made once: the signatures, the tokenizer (`kzoo.data.tokenizer_json`)
    and the Keras model's greedy texts. In LiteRT-LM, the runtime's tokenizer must give the
    Keras tokenizer's ids for each prompt, and its greedy text (`top_k=1`) is compared with
    Keras' greedy `generate` on a one-token prompt, a short one and one longer than the largest
    prefill chunk where the cache allows; the next-token logits of the bundle's `decode`
    signature over held-out rows are compared with Keras'. The caller decides which results
    pass (`kzoo.export.formats.LiteRTLMBundle`).

    Args:
        model: a `GPTCausalLM` (a task with the serving interface and `generate`).
        tokenizer: its keras-hub tokenizer (one `kzoo.data.tokenizer_json` writes).
        token_ids: int `(N, T)`, held-out rows (T at least the cache length, or all of it).
        logits: float `(N, T, V)`, the Keras model's logits for them.
        targets: int `(N, T)`, the next tokens (or the Keras argmax for synthetic rows).
        sample_weight: `(N, T)` or None.
        cache_length: int, the bundles' `max_num_tokens`.
        lengths: the prefill chunk lengths (`prefill_lengths`).
        spans: the cache spans of the bundles' attention (`attention_spans`); None for none.
        generate_tokens: int, new tokens per greedy check.
        num_threads: int, the runtime's CPU threads.
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
    ):
        from kzoo.data.tokenizer_json import hugging_face_tokenizer  # kzoo.data imports tensorflow-datasets

        self.exported = hugging_face_tokenizer(tokenizer)
        self.signatures = RuntimeSignatures(model, cache_length, lengths, spans)
        chat_template = self.exported.chat_template and runtime_chat_template(
            self.exported.chat_template, getattr(tokenizer, "special_tokens_map", {}), self.exported.start_token_id
        )
        self.metadata = llm_metadata(
            cache_length, self.exported.stop_token_ids, self.exported.start_token_id, chat_template=chat_template
        )
        self.cases = _generation_cases(model, tokenizer, token_ids, self.signatures, self.exported, generate_tokens)
        self.positions = min(cache_length, token_ids.shape[1])
        cut = slice(0, self.positions)
        self.token_ids, self.logits, self.targets = token_ids[:, cut], logits[:, cut], targets[:, cut]
        self.weights = None if sample_weight is None else sample_weight[:, cut]
        self.keras_cross_entropy = verification.quality(self.logits, self.targets, self.weights)["cross_entropy"]
        self.num_threads = num_threads
        self._float32 = None

    def write(self, path, conversion):
        """Writes the bundle `path`, its model made as `conversion` (a key of `CONVERSIONS`),
        and checks it.

        Returns:
            The record: the file's `path` (its name), `size_bytes`, `tflite_bytes`,
            `description`, `prefill_lengths`, `max_num_tokens`, `export_seconds`, `ops`,
            `max_abs_diff` and `tolerance` and `quality` (over the reference rows), `checked_rows`,
            `tokenizer` and `generation` (`matches_keras`, `token_agreement` and the cases), and
            `latency_ms`.
        """
        start = time.perf_counter()
        if self._float32 is None:  # converted once, quantized per bundle
            self._float32 = convert(self.signatures, "tflite_fp32")
        flatbuffer = self._float32 if conversion == "tflite_fp32" else quantize(self._float32, conversion)
        write_bundle(path, flatbuffer, self.exported.tokenizer.to_str(), self.metadata)
        seconds = time.perf_counter() - start
        with logs.captured_stderr():  # LiteRT logs its CPU delegate
            logits = np.stack(
                [litertlm_model.teacher_forced_logits(flatbuffer, row, self.num_threads) for row in self.token_ids]
            )
        quality = verification.quality(logits, self.targets, self.weights, self.logits)
        quality["keras_cross_entropy"] = self.keras_cross_entropy
        quality["cross_entropy_increase"] = quality["cross_entropy"] - self.keras_cross_entropy
        record = {
            "path": path.name,
            "size_bytes": path.stat().st_size,
            "tflite_bytes": len(flatbuffer),
            "description": CONVERSIONS[conversion],
            "prefill_lengths": list(self.signatures.prefill_lengths),
            "cache_spans": self.signatures.spans,
            "max_num_tokens": self.signatures.cache_length,
            "export_seconds": round(seconds, 2),
            "ops": op_census(flatbuffer),
            "max_abs_diff": {str(self.positions): verification.max_abs_diff(logits, self.logits)},
            "tolerance": {str(self.positions): verification.fp32_tolerance(self.logits)},
            "quality": quality,
            "checked_rows": len(self.token_ids),
        }
        runtime = litertlm_model.LiteRTLMModel(path, self.num_threads)
        try:
            record.update(_run_cases(runtime, self.cases))
        finally:
            runtime.close()
        return record


def _generation_cases(model, tokenizer, rows, signatures, exported, generate_tokens):
    """Prompts (text and ids) and the Keras model's greedy continuation of each as text.

    Lengths: 1, 7 and, where the cache leaves room, longer than the largest prefill chunk;
    each cut from a held-out row, detokenized and tokenized again (the text is what the
    runtime gets)."""
    cache_length = signatures.cache_length
    new_tokens = max(1, min(generate_tokens, cache_length // 4))
    longest = cache_length - new_tokens
    lengths = sorted({1, min(7, longest), min(2 * signatures.prefill_lengths[-1] + 3, longest)})
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
    # One ragged batch, each row generating what it would alone: Keras compiles one decoding
    # loop for all the prompts, not one per prompt length.
    prompts = [start + case["prompt_ids"] for case in cases]
    outputs = model.generate(
        prompts,
        max_length=max(len(prompt) + case["new_tokens"] for prompt, case in zip(prompts, cases)),
        stop_token_ids=exported.stop_token_ids,
        jit_compile=False,
    )
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
