"""The shared `generate()` machinery of the language models.

A generating task has one serving interface: `prefill(token_ids, cache_length,
**context, last_only=False) -> (logits, state)` runs a prompt into a new decoding state
(with `last_only`, the last position's logits alone: all that generation reads) and
`decode(token_ids, state, index, last_only=False) -> (logits, state)` runs more tokens against it,
where `state` is a dict of named tensors (the KV cache). `decode_loop` runs them
under a sampler; Keras `generate` (here) and the SavedModel's `generate` signature
both call it, and the TFLite and LiteRT-LM signatures wrap the same two methods.
This module also validates and packs the prompts, draws the sampler's noise, and
keeps one compiled loop per (batch size, length, prefill length) across calls.
"""

import numbers
import weakref

import keras
import numpy as np
from keras import ops

from kzoo import config
from kzoo import samplers as samplers_lib
from kzoo.ops import checks

# Compiled decode functions per model, keyed by shapes and sampler settings.
_COMPILED = weakref.WeakKeyDictionary()


def check_token_ids(values, vocabulary_size, name):
    """Raises `ValueError` unless every id in `values` is an integer in `[0, vocabulary_size)`.

    Run on the host before the compiled loop, where an id outside the
    vocabulary gives no error (XLA drops assertions) and a float would be cast
    to an id without one.

    Args:
        values: an array or tensor of any shape, or a list of id lists
            (ragged) or of ids; empty rows pass (the caller says they are).
        vocabulary_size: int.
        name: the argument name used in the message.

    Example:
    >>> check_token_ids([[72, 105], [84]], 256, "prompts")  # passes
    """
    rows = values if isinstance(values, (list, tuple)) else [ops.convert_to_numpy(values)]
    for row in rows:
        row = np.asarray(row)
        if row.size == 0:
            continue
        if not np.issubdtype(row.dtype, np.integer):
            first = row.reshape(-1)[0]  # a NumPy scalar, or any object (None) in an object array
            raise ValueError(
                f"`{name}` must hold integer token ids; received {row.dtype.name} values such as "
                f"{first.item() if isinstance(first, np.generic) else first!r}."
            )
        outside = row[(row < 0) | (row >= vocabulary_size)]
        if outside.size:
            raise ValueError(
                f"`{name}` must be in [0, {vocabulary_size}) (the model's vocabulary_size); "
                f"received {outside[0]}" + (f" and {outside.size - 1} more outside it." if outside.size > 1 else ".")
            )


def check_generate_arguments(model, prompts, max_length, max_new_tokens, stop_token_ids):
    """The checks of `generate`'s arguments that the compiled loop cannot make: ids in the
    vocabulary and integer (prompts and stop ids), lengths positive integers."""
    vocabulary_size = model.backbone.vocabulary_size
    if isinstance(prompts, dict):
        mask = np.asarray(ops.convert_to_numpy(prompts["padding_mask"])).astype(bool)
        check_token_ids(np.asarray(ops.convert_to_numpy(prompts["token_ids"]))[mask], vocabulary_size, "prompts")
    else:
        check_token_ids(prompts, vocabulary_size, "prompts")
    if stop_token_ids is not None:
        check_token_ids(list(stop_token_ids), vocabulary_size, "stop_token_ids")
    for name, value in (("max_length", max_length), ("max_new_tokens", max_new_tokens)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1):
            raise ValueError(f"`{name}` must be an int >= 1; received {name}={value!r}.")


def pack_prompts(prompts, max_length=None, max_new_tokens=None, limit=None, pad_id=0, name="prompts"):
    """Right-pads prompts into `(token_ids, prompt_mask)` of width `max_length`.

    Args:
        prompts: a list of id sequences (ragged), a 2-D array of ids (every
            row full), or a dict with "token_ids" and "padding_mask".
        max_length: total length (prompt + new tokens); defaults to `limit`.
        max_new_tokens: alternatively, new tokens after the longest prompt.
        limit: the model's maximum sequence length.
        pad_id: the id written into empty slots.
        name: the argument name used in errors.

    Returns:
        `(token_ids (B, L) int32, prompt_mask (B, L) bool, was_ragged)`.
    """
    if isinstance(prompts, dict):
        ids = np.asarray(ops.convert_to_numpy(prompts["token_ids"]))
        mask = np.asarray(ops.convert_to_numpy(prompts["padding_mask"])).astype(bool)
        rows = [row[m] for row, m in zip(ids, mask)]
        ragged = False
    elif isinstance(prompts, (list, tuple)):
        rows = [np.asarray(row, dtype="int64").reshape(-1) for row in prompts]
        ragged = True
    else:
        ids = np.asarray(ops.convert_to_numpy(prompts))
        if ids.ndim != 2:
            raise ValueError(f"`{name}` must be 2-D (batch, length); received shape {ids.shape}.")
        rows, ragged = list(ids), False
    if not rows:
        raise ValueError(f"`{name}` is empty: pass at least one prompt.")
    lengths = [len(row) for row in rows]
    if min(lengths) == 0:
        raise ValueError(f"Every prompt needs at least one token; prompt {lengths.index(0)} of `{name}` is empty.")
    longest = max(lengths)
    if limit is not None and longest >= limit:
        raise ValueError(
            f"Prompt {lengths.index(longest)} of `{name}` has {longest} tokens, which leaves no room to generate "
            f"within the model's maximum sequence length ({limit}): a prompt must have fewer than {limit} tokens."
        )
    if max_new_tokens is not None:
        if max_length is not None:
            raise ValueError("Pass `max_length` or `max_new_tokens`, not both.")
        if max_new_tokens < 1:
            raise ValueError(f"`max_new_tokens` must be >= 1; received max_new_tokens={max_new_tokens}.")
        if limit is not None and longest + max_new_tokens > limit:
            raise ValueError(
                f"`max_new_tokens` must be <= {limit - longest}: the longest prompt has {longest} tokens and the "
                f"model's maximum sequence length is {limit}; received max_new_tokens={max_new_tokens}."
            )
        max_length = longest + max_new_tokens
    max_length = max_length or limit
    if limit is not None and max_length > limit:
        raise ValueError(f"`max_length` ({max_length}) must be <= the model's maximum sequence length ({limit}).")
    if longest >= max_length:
        raise ValueError(
            f"The longest prompt has {longest} tokens, which leaves no room to generate: "
            f"`max_length` ({max_length}) must be > {longest}."
        )
    token_ids = np.full((len(rows), max_length), pad_id, "int32")
    prompt_mask = np.zeros((len(rows), max_length), bool)
    for i, row in enumerate(rows):
        token_ids[i, : len(row)] = row
        prompt_mask[i, : len(row)] = True
    return token_ids, prompt_mask, ragged


def prefill_length(prompt_mask):
    """How many positions the prefill runs: the shortest prompt, rounded
    down to a power of two so that few prefill shapes are ever compiled.
    `decode_loop` reads the rest of the shortest prompt in chunks
    (`prompt_chunk`), the rest of each longer one a token at a time."""
    shortest = int(prompt_mask.sum(axis=1).min())
    return 1 << (shortest.bit_length() - 1)


def prompt_chunk(prefill):
    """The positions a call reads of the prompt left after a prefill of `prefill` (a power of
    two; the shortest prompt is shorter than twice that): a quarter of it, so that at most four
    calls read what one token a call would take up to `prefill - 1` calls for. Each call reads
    every weight once, which is what a step costs at 1.5B parameters. 0 (a token a call, one
    compiled body less) under 16, or where `prefill` is a tensor (the whole shortest prompt
    prefilled)."""
    if not isinstance(prefill, numbers.Integral) or prefill < 16:
        return 0
    return prefill // 4


def read_prompt(model, token_ids, state, logits, start, end, chunk):
    """Runs positions `[start, end)` of `token_ids` `(B, L)` into `state`, `chunk` positions a
    `model.decode` call. The last call ends at `end`, so it may read again positions the call
    before it read (and write their keys and values again, the same up to rounding): no call
    reads past `end`. Needs `end >= chunk`.

    Returns:
        `(logits (B, V), state)`: the prediction for position `end` (`logits` where `start` is
        `end` already) and the state.
    """

    def more(logits, state, position):
        return position < end

    def read(logits, state, position):
        position = ops.minimum(position, end - chunk)
        # A gather, not `ops.slice`: TensorFlow's XLA bridge took a slice's dynamic start for a
        # compile-time constant, and so compiled the loop again for every prompt length.
        tokens = ops.take(token_ids, position + ops.arange(chunk, dtype="int32"), axis=1)
        logits, state = model.decode(tokens, state, position, True)
        return logits[:, -1], state, position + chunk

    start = ops.convert_to_tensor(start, "int32")
    logits, state, _ = ops.while_loop(more, read, (logits, state, start))
    return logits, state


def read_prompt_rest(model, token_ids, prompt_mask, state, logits, prefill):
    """After a prefill of `prefill` positions, reads the rest of the shortest prompt in chunks
    (`prompt_chunk`, `read_prompt`), where it has chunks.

    Returns:
        `(logits (B, V), state, index)`: the prediction for position `index`, the state, and
        the first position not read (the shortest prompt's length, or `prefill`).
    """
    chunk = prompt_chunk(prefill)
    if not chunk:
        return logits, state, ops.convert_to_tensor(prefill, "int32")
    end = ops.min(ops.sum(ops.cast(prompt_mask, "int32"), axis=1))
    return (*read_prompt(model, token_ids, state, logits, prefill, end, chunk), end)


def compile_function(fn, jit_compile, models=()):
    """`fn` compiled for repeated calls, as each backend does it best.

    Under TensorFlow, `tf.function` (with XLA if `jit_compile`). Under JAX with `jit_compile`
    and the `models` whose weights `fn` reads, `jax.jit` with those weights as arguments
    (Keras' `StatelessScope`): one compilation per shape, kept in JAX's persistent cache where
    `KZOO_COMPILATION_CACHE` names a folder (`kzoo.config.use_compilation_cache`); weights that
    change after it (fine-tuning) are read at each call. Elsewhere `fn` itself, its arguments
    made tensors, where `ops.while_loop` compiles the loop body. The compiled code checks no
    token id: the caller checks them on the host (`check_generate_arguments`), and the ids the
    loop makes are in the vocabulary. Adds kzoo's XLA options first
    (`kzoo.config.add_xla_flags`): without them XLA's CPU compiler copies every KV cache
    twice per step."""
    config.add_xla_flags()
    backend = keras.backend.backend()
    if backend == "jax" and jit_compile and models:
        return _jax_function(_ids_checked_by_caller(fn), models)
    if backend != "tensorflow":
        # `tf.function` makes tensors of NumPy arguments; elsewhere that is done here, because a
        # NumPy array cannot be indexed by the traced position of `ops.while_loop`'s body.
        return lambda *args: fn(*keras.tree.map_structure(ops.convert_to_tensor, args))
    import tensorflow as tf

    # kzoo's layers are `keras.ops` code that also runs under `jax.jit`, so they need no
    # AutoGraph: converting them yields the same graph, only later (BENCHMARKS.md).
    return tf.function(_ids_checked_by_caller(fn), jit_compile=jit_compile, autograph=False)


def _ids_checked_by_caller(fn):
    def traced(*args):
        with checks.checked_by_caller():
            return fn(*args)

    traced.__name__ = traced.__qualname__ = fn.__name__
    return traced


def _jax_function(fn, models):
    """`fn` under `jax.jit`, the weights of `models` passed in, not baked into the program.

    Closed over, each weight would be a constant of the compiled program (the whole model copied
    into it, and compiled again for every new value); as arguments, a call reads the variables'
    current values. Models are held weakly, as `generate`'s cache holds its functions."""
    import jax

    references = [weakref.ref(model) for model in models]
    compiled = {}

    def variables():
        found = {}
        for reference in references:
            for variable in reference().variables:
                found.setdefault(id(variable), variable)
        return list(found.values())

    def run(*args):
        current = variables()
        key = tuple(id(variable) for variable in current)
        if key not in compiled:  # new variables (a quantized or rebuilt layer): a new program
            compiled.clear()

            def stateless(values, *args):
                with keras.StatelessScope(state_mapping=list(zip(current, values))):
                    return fn(*args)

            stateless.__name__ = stateless.__qualname__ = fn.__name__  # the program's name in JAX's logs and cache
            compiled[key] = jax.jit(stateless)
        values = [variable.value for variable in current]
        return compiled[key](values, *keras.tree.map_structure(ops.convert_to_tensor, args))

    return run


def unpack(token_ids, generated, prompt_mask, ragged):
    """Lists of prompt + new ids for ragged input, else a dict of arrays."""
    token_ids = ops.convert_to_numpy(token_ids)
    mask = np.logical_or(ops.convert_to_numpy(generated), prompt_mask)
    if ragged:
        return [row[m].tolist() for row, m in zip(token_ids, mask)]
    return {"token_ids": token_ids, "padding_mask": mask}


def sampler_key(sampler):
    """Settings baked into the compiled loop (the seed is not: noise is an input)."""
    config = {k: v for k, v in sampler.get_config().items() if k != "seed"}
    return type(sampler).__name__, tuple(sorted(config.items()))


def resolve(sampler, stop_token_ids):
    sampler = samplers_lib.get(sampler)
    stop = np.asarray([] if stop_token_ids is None else list(stop_token_ids), "int32")
    return sampler, stop


def cache_state(caches, prefix=""):
    """`{prefix}key_cache_<i>` and `{prefix}value_cache_<i>` of a `(keys, values)` pair per block."""
    state = {}
    for i, (keys, values) in enumerate(caches):
        state[f"{prefix}key_cache_{i}"], state[f"{prefix}value_cache_{i}"] = keys, values
    return state


def cache_pairs(state, prefix=""):
    """The `(keys, values)` pairs of `cache_state`'s dict, in block order."""
    count = sum(1 for name in state if name.startswith(f"{prefix}key_cache_"))
    return [(state[f"{prefix}key_cache_{i}"], state[f"{prefix}value_cache_{i}"]) for i in range(count)]


def decode_loop(model, sampler, token_ids, prompt_mask, prefill, stop_token_ids, noise, context=None):
    """Prefills the first `prefill` positions of every row and reads the rest of the shortest
    prompt in chunks (`prompt_chunk`), then lets `sampler` decode the rest.

    Rows with longer prompts keep their prompt tokens until those end (the
    sampler reads `prompt_mask`).

    Args:
        model: a task with the serving interface (`prefill`, `decode`).
        sampler: a `kzoo.samplers.Sampler`.
        token_ids: int `(B, L)`, prompts right-padded to the total length L.
        prompt_mask: bool `(B, L)`, True on prompt tokens.
        prefill: int or scalar int tensor in [1, shortest prompt].
        stop_token_ids: int `(N,)`, possibly empty.
        noise: the sampler's noise `(L, B)`.
        context: `prefill`'s other arguments (a seq2seq model's source).

    Returns:
        `(token_ids (B, L), generated (B, L) bool)`.
    """
    logits, state = model.prefill(token_ids[:, :prefill], ops.shape(token_ids)[1], last_only=True, **(context or {}))
    logits, state, index = read_prompt_rest(model, token_ids, prompt_mask, state, logits[:, -1], prefill)

    def step(token, state, index):
        logits, state = model.decode(token, state, index)
        return logits[:, -1], state

    return sampler.run(
        step,
        token_ids,
        prompt_mask=prompt_mask,
        logits=logits,
        cache=state,
        index=index,
        stop_token_ids=stop_token_ids,
        noise=noise,
    )


def generate(model, prompts, *, max_length, max_new_tokens, sampler, stop_token_ids, jit_compile, limit, context=None):
    """Packs `prompts`, runs the compiled `decode_loop` and unpacks the result.

    Args:
        model: a task with the serving interface; its compiled functions are
            cached on it.
        limit: the model's maximum sequence length.
        context: `prefill`'s other arguments (a seq2seq model's source ids).
        Others: as in `GPTCausalLM.generate`.
    """
    check_generate_arguments(model, prompts, max_length, max_new_tokens, stop_token_ids)
    sampler, stop = resolve(sampler, stop_token_ids)
    token_ids, prompt_mask, ragged = pack_prompts(prompts, max_length, max_new_tokens, limit)
    batch, length = token_ids.shape
    prefill = prefill_length(prompt_mask)
    functions = _COMPILED.setdefault(model, {})
    key = (batch, length, prefill, sampler_key(sampler), jit_compile)
    if key not in functions:
        # A weak reference: the function is the cache's value, and one that held its model (the
        # cache's key) would keep the model, and its weights, alive for as long as the process.
        model_ref = weakref.ref(model)

        def decode(token_ids, prompt_mask, stop_token_ids, noise, context):
            return decode_loop(model_ref(), sampler, token_ids, prompt_mask, prefill, stop_token_ids, noise, context)

        functions[key] = compile_function(decode, jit_compile, models=(model,))
    ids, generated = functions[key](token_ids, prompt_mask, stop, sampler.noise(length, batch), context or {})
    return unpack(ids, generated, prompt_mask, ragged)
