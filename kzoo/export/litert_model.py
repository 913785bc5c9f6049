"""Runs kzoo's TFLite files with LiteRT: signatures, and greedy generation over the KV cache.

This module imports only NumPy and `ai_edge_litert`, never TensorFlow or the rest of kzoo,
so that a device (or `export/serve_tflite.py`, which loads this file by its path) can use it
without them. kzoo's exporter verifies its TFLite files through it too, so what is
checked is what is served.
"""

import time

import numpy as np
from ai_edge_litert.interpreter import Interpreter


class LiteRTModel:
    """A kzoo `.tflite` file in the LiteRT interpreter, called by signature.

    Every kzoo TFLite file has a `serving_default` signature; those of
    GPTCausalLM and Seq2SeqTransformer also have `prefill` and `decode`, with
    the KV cache as explicit state (see `kzoo.export.ServingModule`), which
    `generate` drives one token at a time.

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
        if isinstance(model, (bytes, bytearray)):
            self.interpreter = Interpreter(model_content=bytes(model), num_threads=num_threads)
        else:
            self.interpreter = Interpreter(model_path=str(model), num_threads=num_threads)
        self.signatures = self.interpreter.get_signature_list()
        self._runners = {name: self.interpreter.get_signature_runner(name) for name in self.signatures}

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
                f"Signature {signature!r} takes inputs {sorted(details)}; "
                f"missing {missing}, unknown {unknown}."
            )
        inputs = {name: np.asarray(value, details[name]["dtype"]) for name, value in inputs.items()}
        runner = self._runners[signature]
        batch = {value.shape[0] for value in inputs.values() if value.ndim > 0}
        fixed_batch = any(d["shape_signature"][:1].tolist() == [1] for d in details.values() if len(d["shape_signature"]))
        if fixed_batch and batch and max(batch) > 1:
            rows = [runner(**{name: value[i : i + 1] for name, value in inputs.items()}) for i in range(max(batch))]
            return {name: np.concatenate([row[name] for row in rows]) for name in rows[0]}
        return runner(**inputs)

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
        prompt_ids = [int(token) for token in prompt_ids]
        max_length = max_length or self.cache_length
        if not prompt_ids:
            raise ValueError("The prompt needs at least one token.")
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


def median_ms(function, runs=20):
    """Median wall time of `function()` over `runs` calls after one warm-up call, in milliseconds."""
    function()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return 1000 * float(np.median(times))
