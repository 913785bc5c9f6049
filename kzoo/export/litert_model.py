"""Runs kzoo's TFLite files with LiteRT: signatures, and greedy generation over the KV cache.

This module imports only NumPy and `ai_edge_litert`, never TensorFlow or the rest of kzoo,
so that a device (or `export/serve_tflite.py`, which loads this file by its path) can use it
without them. kzoo's exporter verifies its TFLite files through it too, so what is
checked is what is served.
"""

import json
import mmap
import time
from pathlib import Path

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.interpreter import Interpreter

# The metadata entry kzoo's exporter writes (`kzoo.export.ServingSignatures.info`).
INFO_NAME = b"kzoo_model"


class LiteRTModel:
    """A kzoo `.tflite` file in the LiteRT interpreter, called by signature.

    Every kzoo TFLite file has a `serving_default` signature; those of
    GPTCausalLM and Seq2SeqTransformer also have `prefill` and `decode`, with
    the KV cache as explicit state (see `kzoo.export.ServingModule`), which
    `generate` drives one token at a time.

    Inputs are checked before anything runs, as compiled TFLite code has no
    assertions (an id outside the vocabulary gives NaN logits): token ids
    must be integers in `[0, vocabulary_size)`, no input may be empty, and a
    sequence may not be longer than the model's maximum (or a generation
    than the cache). The vocabulary size and maximum length come from the
    file's `kzoo_model` metadata (`info`); files without it get every check
    but the range and the length.

    Args:
        model: the path of a `.tflite` file, or its bytes.
        num_threads: int, LiteRT's CPU threads (its own default is 1).

    Example:
    >>> lm = LiteRTModel("export/model_fp32.tflite")
    >>> lm.run(token_ids=ids, padding_mask=mask)["logits"].shape
    (1, 7, 256)
    >>> lm.generate([72, 105], max_length=20)
    """

    def __init__(self, model, num_threads=2):
        in_memory = isinstance(model, (bytes, bytearray))
        name = "the TFLite model" if in_memory else str(model)
        if not in_memory and not Path(model).is_file():
            raise FileNotFoundError(f"No TFLite file at {model}.")
        try:
            if in_memory:
                self.interpreter = Interpreter(model_content=bytes(model), num_threads=num_threads)
                self.info = read_info(model)
            else:
                self.interpreter = Interpreter(model_path=str(model), num_threads=num_threads)
                with open(model, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                    self.info = read_info(mapped)
            self.interpreter.allocate_tensors()  # here, where LiteRT also logs its CPU delegate
            self.signatures = self.interpreter.get_signature_list()
            self._runners = {name: self.interpreter.get_signature_runner(name) for name in self.signatures}
        except (ValueError, RuntimeError, IndexError) as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ValueError(f"{name} is not a valid TFLite file (empty, truncated or corrupt?): {reason}") from error
        if "serving_default" not in self.signatures:
            raise ValueError(f"{name} has no serving_default signature: it was not written by kzoo's export.")

    def input_details(self, signature="serving_default"):
        """`{name: {"shape_signature": ..., "dtype": ...}}` of a signature's inputs."""
        return self._runners[signature].get_input_details()

    def run(self, signature="serving_default", **inputs):
        """Runs `signature` on NumPy `inputs` (cast to the input dtypes) and returns its outputs.

        A signature with a fixed batch of 1 (kzoo's recurrent models) runs
        each row on its own and stacks the results.
        """
        details = self.input_details(signature)
        missing = sorted(set(details) - set(inputs))
        unknown = sorted(set(inputs) - set(details))
        if missing or unknown:
            raise ValueError(
                f"Signature {signature!r} takes inputs {sorted(details)}; missing {missing}, unknown {unknown}."
            )
        inputs = {name: self._checked(name, value, details[name]["dtype"]) for name, value in inputs.items()}
        runner = self._runners[signature]
        batch = {value.shape[0] for value in inputs.values() if value.ndim > 0}
        fixed_batch = any(
            d["shape_signature"][:1].tolist() == [1] for d in details.values() if len(d["shape_signature"])
        )
        if fixed_batch and batch and max(batch) > 1:
            rows = [runner(**{name: value[i : i + 1] for name, value in inputs.items()}) for i in range(max(batch))]
            return {name: np.concatenate([row[name] for row in rows]) for name in rows[0]}
        return runner(**inputs)

    def _checked(self, name, value, dtype):
        """`value` as a `dtype` array, after the checks the compiled file cannot make."""
        array = np.asarray(value)
        if np.issubdtype(dtype, np.integer) and array.size and not np.issubdtype(array.dtype, np.integer):
            raise ValueError(f"`{name}` must hold integers; received {array.dtype.name} values.")
        if array.ndim and 0 in array.shape:
            raise ValueError(f"`{name}` is empty (shape {array.shape}): pass at least one token.")
        if name.endswith("token_ids"):
            check_token_ids(array, self.info.get("vocabulary_size"), name, self.info.get("max_sequence_length"))
        return array.astype(dtype, copy=False)

    @property
    def cache_length(self):
        """The positions of the KV cache (the longest generation), or None without `decode`."""
        if "decode" not in self._runners:
            return None
        return int(self.input_details("decode")["key_cache_0"]["shape_signature"][2])

    def generate(self, prompt_ids, max_length=None, stop_token_ids=(), encoder_token_ids=None, on_step=None):
        """Greedy decoding: the prompt, then the argmax token until `max_length` or a stop token.

        Args:
            prompt_ids: a list of ints, at least one: the prompt (seq2seq:
                the decoder's, e.g. [BOS]).
            max_length: int, total length of prompt + new tokens; defaults to
                (and must be <=) the cache length.
            stop_token_ids: ids that end the generation (kept in the output).
            encoder_token_ids: list of ints, the source of a seq2seq model.
            on_step: optional callable `(signature, inputs)` called before
                each prefill/decode run (e.g. to time a decode step).

        Returns:
            A list of ints: the prompt and the generated tokens.
        """
        if "decode" not in self._runners:
            raise ValueError("This model has no `prefill`/`decode` signatures: it does not generate.")
        vocabulary_size = self.info.get("vocabulary_size")
        prompt_ids = check_token_ids(prompt_ids, vocabulary_size, "prompt_ids").reshape(-1).tolist()
        stop_token_ids = check_token_ids(stop_token_ids, vocabulary_size, "stop_token_ids").reshape(-1).tolist()
        if encoder_token_ids is not None:
            encoder_token_ids = (
                check_token_ids(
                    encoder_token_ids, vocabulary_size, "encoder_token_ids", self.info.get("max_sequence_length")
                )
                .reshape(-1)
                .tolist()
            )
            if not encoder_token_ids:
                raise ValueError("`encoder_token_ids` is empty: the source needs at least one token.")
        if max_length is None:
            max_length = self.cache_length
        if not prompt_ids:
            raise ValueError("The prompt needs at least one token.")
        if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)):
            raise ValueError(f"`max_length` must be an int; received {max_length!r}.")
        if not len(prompt_ids) < max_length <= self.cache_length:
            raise ValueError(
                f"`max_length` ({max_length}) must be > the prompt length ({len(prompt_ids)}) "
                f"and <= the cache length ({self.cache_length})."
            )
        prefill_names = set(self.input_details("prefill"))
        inputs = {"token_ids": np.asarray([prompt_ids], np.int32)}
        if "encoder_token_ids" in prefill_names:
            if encoder_token_ids is None:
                raise ValueError("This is a seq2seq model: pass `encoder_token_ids`.")
            inputs = {
                "encoder_token_ids": np.asarray([encoder_token_ids], np.int32),
                "decoder_token_ids": inputs["token_ids"],
            }
        state_names = set(self.input_details("decode")) - {"token_ids", "cache_index"}
        tokens, signature = list(prompt_ids), "prefill"
        stop = {int(token) for token in stop_token_ids}
        while True:
            if on_step is not None:
                on_step(signature, inputs)
            outputs = self._runners[signature](**inputs)
            token = int(np.argmax(outputs["logits"][0]))
            tokens.append(token)
            if token in stop or len(tokens) == max_length:
                return tokens
            # Caches `decode` updates come from its outputs, the rest (seq2seq's
            # cross-attention caches) is passed on unchanged.
            state = {name: outputs[name] if name in outputs else inputs[name] for name in state_names}
            inputs = {
                "token_ids": np.asarray([[token]], np.int32),
                "cache_index": np.asarray(len(tokens) - 1, np.int32),
                **state,
            }
            signature = "decode"

    def latency_ms(self, signature="serving_default", runs=20, **inputs):
        """Median wall time of one call of `signature` on `inputs`, in milliseconds."""
        runner = self._runners[signature]
        details = self.input_details(signature)
        inputs = {name: np.asarray(value, details[name]["dtype"]) for name, value in inputs.items()}
        return median_ms(lambda: runner(**inputs), runs)


def read_info(flatbuffer):
    """The `kzoo_model` metadata of a TFLite flatbuffer (a dict), or {} if it has none."""
    model = schema.Model.GetRootAs(flatbuffer, 0)
    for i in range(model.MetadataLength()):
        entry = model.Metadata(i)
        if entry.Name() == INFO_NAME:
            return json.loads(model.Buffers(entry.Buffer()).DataAsNumpy().tobytes())
    return {}


def check_token_ids(values, vocabulary_size=None, name="token_ids", max_length=None):
    """`values` as an integer array, after checking that they are ids in `[0, vocabulary_size)`
    (when known) and that no row is longer than `max_length` (when given); else ValueError.

    An empty list passes: the caller knows whether one is allowed.
    """
    array = np.asarray(values)
    if array.size == 0:
        return array.astype(np.int64)
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(
            f"`{name}` must hold integer token ids; received {array.dtype.name} values "
            f"such as {array.reshape(-1)[0].item()!r}."
        )
    if vocabulary_size is not None:
        outside = array[(array < 0) | (array >= vocabulary_size)]
        if outside.size:
            raise ValueError(
                f"`{name}` must be in [0, {vocabulary_size}) (the model's vocabulary_size); received {outside[0]}"
                + (f" and {outside.size - 1} more outside it." if outside.size > 1 else ".")
            )
    if max_length is not None and array.ndim and array.shape[-1] > max_length:
        raise ValueError(f"`{name}` has {array.shape[-1]} tokens, more than the model's maximum of {max_length}.")
    return array


def median_ms(function, runs=20):
    """Median wall time of `function()` over `runs` calls after one warm-up call, in milliseconds."""
    function()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return 1000 * float(np.median(times))
