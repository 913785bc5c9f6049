"""The TFLite model of a bundle, in the runtime's conventions (read from LiteRT-LM's sources,
`runtime/executor/llm_litert_compiled_model_executor.cc` and
`litert_compiled_model_executor_utils.cc`): signatures `prefill_<N>` for a few chunk lengths
N and `decode`; inputs `tokens` `(1, N)` int32 and `input_pos` `(N,)` int32 (the "PyTorch,
CPU only" signature: no mask input, the model masks causally itself); the KV cache as
`kv_cache_k_<i>` / `kv_cache_v_<i>`, inputs and outputs of the same names (the runtime
hands the outputs of one call to the next, on the CPU in the same buffers); `decode` returns
`logits` `(1, 1, V)`; batch 1. The cache keeps kzoo's head-major layout
`(1, heads, cache_length, head_dim)`: the CPU runtime never looks inside it.

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
import functools
import numbers

import tensorflow as tf

from kzoo.export.serving_signatures import state_specs
from kzoo.layers import cache_spans
from kzoo.layers.kv_cache import one_row_as_is
from kzoo.models import TiedLogits

# Prefill chunk lengths, of which those that divide the cache length are used.
DEFAULT_PREFILL_LENGTHS = (16, 64, 256)

# The signature only the export's checks run (`RuntimeSignatures(check_length=)`): a prefill chunk
# that also returns its logits `(1, N, V)`, so a check reads a row's logits a chunk at a time, each
# read of the weights giving N positions' logits instead of one. A bundle never ships it
# (`kzoo.export.tflite.graph_passes.without_signatures`).
TEACHER_FORCED = "teacher_forced"


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
    `kzoo.export.tflite.convert.convert` reads (`tflite_functions`, `variables`, `tied_embeddings`)
    make it convertible like `ServingSignatures`.

    Args:
        model: a task with the serving interface and no context besides the prompt (a
            `GPTCausalLM`).
        cache_length: int, the KV cache positions: the bundle's `max_num_tokens`.
        lengths: the prefill chunk lengths (`prefill_lengths`).
        spans: the cache spans its attention may read (`attention_spans`); None for none.
        check_length: None, or the chunk length N in `[1, cache_length]` of a `TEACHER_FORCED`
            signature, traced last (its subgraphs the file's last).

    The signatures are traced when converted (`tflite_functions`, `traced_one_at_a_time`), not
    when made: a context the tracing needs (`kzoo.export.tflite.placeholders.Placeholders`)
    encloses the conversion.
    """

    # No `kzoo_model` metadata entry: the bundle's LlmMetadata describes the model.
    info = None

    def __init__(self, model, cache_length, lengths=None, spans=None, check_length=None):
        if check_length is not None and not 1 <= check_length <= cache_length:
            raise ValueError(
                f"`check_length` must be in [1, {cache_length}] (the cache length); received {check_length}."
            )
        self.cache_length = cache_length
        self.prefill_lengths = prefill_lengths(cache_length, lengths)
        self.spans = attention_spans(cache_length, spans)
        self.tied_embeddings = any(isinstance(layer, TiedLogits) for layer in model.layers)
        prefill = tf.function(
            lambda tokens: model.prefill(tokens, cache_length)[1],
            input_signature=[tf.TensorSpec([1, None], tf.int32)],
            autograph=False,
        )
        names, specs = [], []
        for spec in state_specs(prefill):
            names.append(spec.name)
            specs.append(tf.TensorSpec(spec.shape, spec.dtype, name=runtime_name(spec.name)))
        # (made when traced, queries): decode's one token last.
        self._functions = [
            (functools.partial(_prefill, model, n, cache_length, names, specs), n) for n in self.prefill_lengths
        ]
        self._functions.append((functools.partial(_decode, model, names, specs), 1))
        self._check = check_length and (
            functools.partial(_prefill, model, check_length, cache_length, names, specs, TEACHER_FORCED),
            check_length,
        )
        self._concrete = None

    def tflite_functions(self, generation=True):
        if self._concrete is None:
            self._concrete = [self._traced(*function) for function in self._functions]
            if self._check:
                self._concrete.append(self._traced(*self._check))
        return self._concrete

    def traced_one_at_a_time(self):
        """Yields each signature's concrete function, `decode` (the largest to convert) first,
        traced when reached and held by nothing here, for `convert(..., apart=True)`: a traced
        graph, and what the converter adds to it, is hundreds of megabytes for a 24-layer model
        whatever its width, and goes with the function."""
        for function in reversed(self._functions):
            yield self._traced(*function)
        if self._check:
            yield self._traced(*self._check)

    def _traced(self, make, queries):
        # Without spans, the whole cache as before them (sliding-window layers too).
        spans = cache_spans(self.spans, max_queries=queries) if self.spans else contextlib.nullcontext()
        with spans, one_row_as_is():
            return make().get_concrete_function()


def attention_spans(cache_length, spans):
    """The cache prefixes a bundle's attention may read instead of the whole cache
    (`kzoo.layers.cache_spans`).

    The runtime hands every call the whole cache, and LiteRT's attention over it packs all its
    keys and values, written or not: in a long cache, most of a step's time beyond its weights
    (BENCHMARKS.md). With spans, a step reads the first span that holds its positions (a TFLite `IF`
    per layer, the largest span outermost), so it costs what the position has reached; a
    sliding-window layer reads at most its window. Past the largest span a step runs as without
    spans. Slicing the cache to the exact position instead makes shapes known only at run time,
    which cost LiteRT-LM more per call than the whole attention.

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


def _prefill(model, length, cache_length, names, cache_specs, name=None):
    """`prefill_<length>`, or the signature `name` (`TEACHER_FORCED`) that returns the chunk's
    logits too."""

    def prefill(tokens, input_pos, *cache):
        # A slice of [0, cache_length) at the chunk's start: a chunk that would run past the
        # cache fails here, where the cache update would silently clamp its start.
        start = tf.slice(tf.range(cache_length), input_pos[:1], [length])[0]
        logits, cache = _step(model, tokens, start, names, cache)
        return {"logits": logits, **cache} if name else cache

    prefill.__name__ = name or f"prefill_{length}"  # the signature's name in the TFLite file
    specs = [tf.TensorSpec([1, length], tf.int32, name="tokens"), tf.TensorSpec([length], tf.int32, name="input_pos")]
    return tf.function(prefill, input_signature=[*specs, *cache_specs], autograph=False)


def _decode(model, names, cache_specs):
    # Traced for a token count unknown to Keras, the step takes the same path as a prefill
    # chunk, so the converter derives the same constants from the weights for both and
    # stores them once (a one-token step otherwise multiplies by the query, key and value
    # kernels side by side, a second, fused copy of them). The converter's shape inference
    # then makes every shape static again.
    step_specs = [tf.TensorSpec([1, None], tf.int32), tf.TensorSpec([], tf.int32), *cache_specs]

    @tf.function(input_signature=step_specs, autograph=False)
    def step(tokens, index, *cache):
        return _step(model, tokens, index, names, cache)

    def decode(tokens, input_pos, *cache):
        logits, cache = step(tokens, input_pos[0], *cache)
        return {"logits": tf.ensure_shape(logits, [1, 1, logits.shape[-1]]), **cache}  # (1, 1, V)

    specs = [tf.TensorSpec([1, 1], tf.int32, name="tokens"), tf.TensorSpec([1], tf.int32, name="input_pos")]
    return tf.function(decode, input_signature=[*specs, *cache_specs], autograph=False)
