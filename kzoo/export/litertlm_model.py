"""Runs kzoo's `.litertlm` bundles in Google's LiteRT-LM runtime, streaming text.

Serving needs only `litert_lm` (the `litert-lm-api` package) and `litert_lm_builder` (to read
a bundle's header); `teacher_forced_logits` also NumPy and `ai_edge_litert`. This module never
imports TensorFlow or the rest of kzoo, so that `export/serve_litertlm.py` can load it by its
path. kzoo's exporter verifies its bundles through it too, so what is checked is what is served.

A bundle (`kzoo.export.litertlm` writes them) holds the TFLite model, a Hugging Face
`tokenizer.json` and an `LlmMetadata` proto (start and stop tokens, the maximum number of
tokens, the default sampler). The runtime tokenizes the prompt, prefills it in chunks, then
decodes one token at a time until a stop token, `max_new_tokens` or the maximum.
"""

import contextlib
import math
import os
import struct
import tempfile
import time
from pathlib import Path

_MAGIC = b"LITERTLM"
_HEADER_BEGIN = 32  # the header's flatbuffer starts here; its end offset is stored at byte 24
_HEADER_END_AT = 24

# The options LiteRT-LM takes, as (type, lowest, highest): the runtime passes integers as
# 32-bit C ints, which would silently wrap (a top-k of 2**32 + 1 samples greedily).
_INT32 = 2**31 - 1
OPTIONS = {
    "num_threads": (int, 1, _INT32),
    "top_k": (int, 1, _INT32),
    "top_p": (float, 0.0, 1.0),
    "temperature": (float, 0.0, math.inf),
    "seed": (int, -_INT32 - 1, _INT32),
}


def option_problem(name, value):
    """What is wrong with `value` for the option `name` of `OPTIONS` ("must be ...; received
    ..."), or None if nothing is (None itself is the default)."""
    kind, low, high = OPTIONS[name]
    number = (int, float) if kind is float else int
    if value is None or (
        isinstance(value, number) and not isinstance(value, bool) and math.isfinite(value) and low <= value <= high
    ):
        return None
    if kind is int:
        return f"must be an integer in [{low}, {high}]; received {value!r}"
    upper = f"{high:g}]" if math.isfinite(high) else "inf)"
    return f"must be a finite number in [{low:g}, {upper}; received {value!r}"


def check_options(**options):
    """Raises ValueError naming the first option of `OPTIONS` that is out of its range."""
    for name, value in options.items():
        problem = option_problem(name, value)
        if problem:
            raise ValueError(f"`{name}` {problem}.")


class LiteRTLMModel:
    """A `.litertlm` bundle in LiteRT-LM, on the CPU: text in, text out.

    Each `stream` or `generate` call runs one session: the prompt (tokenized by the bundle's
    own tokenizer, after its start token if it has one), then up to `max_new_tokens` tokens,
    stopping early at a stop token (not part of the text). Greedy decoding (`top_k=1`) gives
    the tokens of the Keras model's greedy `generate` (the exporter checks this).

    Bad input raises ValueError before the runtime sees it: an empty prompt, a prompt that
    leaves no room in the bundle's `max_num_tokens`, `max_new_tokens` beyond that room, a
    sampler option or thread count out of its range (`OPTIONS`).
    Characters outside the vocabulary are tokenized as the bundle's tokenizer says (kzoo's
    character tokenizer: the unknown id 26).

    Args:
        path: the `.litertlm` file. A file that is not a bundle, or is truncated, raises
            ValueError naming it (the runtime itself would abort the process).
        num_threads: int, CPU threads.
        cache_dir: a folder where the runtime keeps the bundle's weights packed for the CPU (made
            if need be), so that a later load of the same bundle reads them instead of packing
            them again; None for a temporary folder, removed by `close`. Either way the packed
            weights are a file mapping the kernel can page out, not more copies of the weights
            in the process's own memory; ":nocache" keeps them in the process.

    Example:
    >>> lm = LiteRTLMModel("runs/gpt_lm/export/model.litertlm")
    >>> for text in lm.stream("ROMEO:", max_new_tokens=100, top_k=5, seed=0):
    ...     print(text, end="", flush=True)
    """

    def __init__(self, path, num_threads=2, cache_dir=None):
        import litert_lm

        check_options(num_threads=num_threads)
        self.path = Path(path)
        self.metadata = read_metadata(self.path)
        self.max_num_tokens = int(self.metadata.max_num_tokens)
        self.stop_token_ids = [list(token.token_ids.ids) for token in self.metadata.stop_tokens]
        start = self.metadata.start_token
        self.start_token_ids = list(start.token_ids.ids) if start.HasField("token_ids") else []
        litert_lm.set_min_log_severity(litert_lm.LogSeverity.ERROR)
        self._litert_lm = litert_lm
        self._cache = tempfile.TemporaryDirectory(prefix="kzoo-litertlm-") if cache_dir is None else None
        if cache_dir is not None and str(cache_dir) != ":nocache":
            Path(cache_dir).mkdir(parents=True, exist_ok=True)  # the runtime fails to load without it
        try:
            self.engine = litert_lm.Engine(
                str(self.path),
                backend=litert_lm.Backend.CPU(thread_count=num_threads),
                cache_dir=self._cache.name if cache_dir is None else str(cache_dir),
                enable_benchmark=True,
            )
        except RuntimeError as error:
            self._remove_cache()
            raise ValueError(f"LiteRT-LM could not load {self.path}: {error}") from error

    def tokenize(self, text):
        """The ids the bundle's tokenizer gives `text` (without the start token)."""
        return list(self.engine.tokenize(text))

    def detokenize(self, token_ids):
        return self.engine.detokenize([int(token) for token in token_ids])

    def stream(self, prompt, max_new_tokens=None, *, top_k=None, top_p=None, temperature=None, seed=None):
        """Yields the text after `prompt` as the runtime produces it.

        Args:
            prompt: str, at least one character.
            max_new_tokens: int, the most tokens to generate; defaults to all the room left
                in the bundle's `max_num_tokens`.
            top_k, top_p, temperature, seed: the sampler; all None gives the bundle's
                default sampler, `top_k=1` greedy decoding. A fixed seed repeats the text.
        """
        session = self._session(prompt, max_new_tokens, top_k=top_k, top_p=top_p, temperature=temperature, seed=seed)
        try:
            session.run_prefill([prompt])
            for response in session.run_decode_async():
                yield "".join(response.texts)
        finally:
            session.close()

    def generate(self, prompt, max_new_tokens=None, **sampler):
        """The whole text after `prompt` (see `stream`)."""
        return "".join(self.stream(prompt, max_new_tokens, **sampler))

    def timed_generate(self, prompt, max_new_tokens=None, **sampler):
        """`(text, timing)`: `generate` and the runtime's own timing of it:
        `{"prefill_tokens", "prefill_tokens_per_second", "decode_tokens",
        "decode_tokens_per_second", "seconds"}` (wall time from prefill to the last token)."""
        session = self._session(prompt, max_new_tokens, **sampler)
        try:
            start = time.perf_counter()
            session.run_prefill([prompt])
            text = "".join("".join(response.texts) for response in session.run_decode_async())
            seconds = time.perf_counter() - start
            info = session.get_benchmark_info()
        finally:
            session.close()
        return text, {
            "prefill_tokens": info.last_prefill_token_count,
            "prefill_tokens_per_second": info.last_prefill_tokens_per_second,
            "decode_tokens": info.last_decode_token_count,
            "decode_tokens_per_second": info.last_decode_tokens_per_second,
            "seconds": seconds,
        }

    def stream_chat(self, messages, max_new_tokens=None, **sampler):
        """Yields the assistant's reply to a conversation as the runtime produces it.

        The runtime renders the messages with the bundle's chat template (kzoo writes the
        checkpoint's, `kzoo.export.litertlm.runtime_chat_template`: the prompt text
        transformers' `apply_chat_template(messages, add_generation_prompt=True)` gives) and
        generates until the template's end-of-turn token, which the reply does not include.
        Each call prefills the whole conversation: after a reply cut short by `max_new_tokens`,
        the runtime's own incremental conversation continues otherwise than the same
        conversation rendered afresh, which is what Keras' `CausalLM.chat` answers.

        Args:
            messages: a list of `{"role": ..., "content": ...}` dicts with string contents
                (a system message, user and assistant turns), ending with the user's.
            max_new_tokens: int, the longest reply; defaults to all the room left in the
                bundle's `max_num_tokens`.
            **sampler: `stream`'s `top_k`, `top_p`, `temperature`, `seed`.

        Raises:
            ValueError: for a bundle without a chat template, a message that is not a dict
                with a string "role" and "content", or a conversation that does not fit.
        """
        check_messages(messages)
        check_options(**sampler)
        if not self.metadata.jinja_prompt_template:
            raise ValueError(f"{self.path.name} has no chat template: its model was exported without one.")
        conversation = self.engine.create_conversation(
            messages=[dict(message) for message in messages[:-1]], sampler_config=self._sampler(**sampler)
        )
        try:
            prompt = conversation.render_message_to_string(dict(messages[-1]))
            if not prompt:  # the runtime has logged the template's error
                raise ValueError(f"The chat template of {self.path.name} does not render this conversation.")
            max_new_tokens = self._check_room(len(self.tokenize(prompt)), max_new_tokens, "conversation")
            for message in conversation.send_message_async(dict(messages[-1]), max_output_tokens=max_new_tokens):
                yield str(message)
        finally:
            conversation.close()

    def chat(self, messages, max_new_tokens=None, **sampler):
        """The whole reply to `messages` (see `stream_chat`)."""
        return "".join(self.stream_chat(messages, max_new_tokens, **sampler))

    def check_request(self, prompt, max_new_tokens=None, **sampler):
        """The number of new tokens a request gets; raises ValueError for a bad one (`sampler`:
        `stream`'s options)."""
        check_options(**sampler)
        if not isinstance(prompt, str) or not prompt:
            raise ValueError(f"The prompt must be a non-empty string; received {prompt!r}.")
        return self._check_room(len(self.tokenize(prompt)), max_new_tokens, "prompt")

    def _check_room(self, prompt_tokens, max_new_tokens, what):
        """The new tokens a prompt of `prompt_tokens` (a `what`) gets; ValueError if none fit."""
        length = len(self.start_token_ids) + prompt_tokens
        room = self.max_num_tokens - length
        if room < 1:
            raise ValueError(
                f"The {what} is {length} tokens long; {self.path.name} takes at most {self.max_num_tokens} "
                f"tokens in all, so a {what} may have at most {self.max_num_tokens - 1}."
            )
        if max_new_tokens is None:
            return room
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or not 1 <= max_new_tokens <= room:
            raise ValueError(
                f"`max_new_tokens` must be in [1, {room}]: the {what}'s {length} tokens and the new ones must "
                f"fit in the {self.max_num_tokens} tokens of {self.path.name}; received {max_new_tokens}."
            )
        return max_new_tokens

    def _session(self, prompt, max_new_tokens, **sampler):
        max_new_tokens = self.check_request(prompt, max_new_tokens, **sampler)
        return self.engine.create_session(
            apply_prompt_template=False, sampler_config=self._sampler(**sampler), max_output_tokens=max_new_tokens
        )

    def _sampler(self, top_k=None, top_p=None, temperature=None, seed=None):
        # Unset options come from the bundle's sampler: litert_lm would make them greedy.
        default = self.metadata.sampler_params
        greedy = default.type == default.GREEDY
        return self._litert_lm.SamplerConfig(
            top_k=top_k if top_k is not None else (1 if greedy else default.k or None),
            top_p=default.p if top_p is None else top_p,
            temperature=default.temperature if temperature is None else temperature,
            seed=default.seed if seed is None else seed,
        )

    def close(self):
        self.engine.close()
        self._remove_cache()

    def _remove_cache(self):
        if self._cache is not None:
            self._cache.cleanup()


def check_messages(messages):
    """Raises ValueError naming the first message of a chat that is not a dict with a string
    "role" and a string "content", or for a list that is empty or does not end with the user's."""
    if isinstance(messages, (str, bytes, dict)) or not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(
            f"`messages` must be a non-empty list of {{'role', 'content'}} dicts; received {messages!r:.80}."
        )
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"Message {index} must be a dict with a 'role' and a 'content'; received {message!r:.80}.")
        if not isinstance(message.get("role"), str):
            raise ValueError(f"Message {index} has no 'role' (a string such as 'user'): {message!r:.80}.")
        if not isinstance(message.get("content"), str):
            raise ValueError(f"Message {index} (role {message['role']!r}) has no 'content' string: {message!r:.80}.")
    if messages[-1]["role"] != "user":
        raise ValueError(f"The last message must be the user's; received role {messages[-1]['role']!r}.")


def read_sections(path):
    """`[(data_type, model_type or None, begin, end)]` of a `.litertlm` file, after checking
    that it is one and that no section runs past its end; raises FileNotFoundError or
    ValueError naming the file."""
    from litert_lm_builder import litertlm_core
    from litert_lm_builder import litertlm_header_schema_py_generated as schema

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No LiteRT-LM bundle at {path}.")
    size = path.stat().st_size
    with open(path, "rb") as file:
        head = file.read(_HEADER_BEGIN)
        if len(head) < _HEADER_BEGIN or not head.startswith(_MAGIC):
            raise ValueError(f"{path} is not a LiteRT-LM bundle (.litertlm): it does not start with {_MAGIC!r}.")
        header_end = struct.unpack_from("<Q", head, _HEADER_END_AT)[0]
        if not _HEADER_BEGIN < header_end <= size:
            raise ValueError(f"{path} is truncated or corrupt: its header ends at byte {header_end} of {size}.")
        header = file.read(header_end - _HEADER_BEGIN)
    try:
        objects = schema.LiteRTLMMetaData.GetRootAs(header, 0).SectionMetadata()
        sections = []
        for i in range(objects.ObjectsLength()):
            section = objects.Objects(i)
            items = {section.Items(j).Key().decode(): section.Items(j) for j in range(section.ItemsLength())}
            model_type = None
            if "model_type" in items:
                model_type = schema.StringValue()
                model_type.Init(items["model_type"].Value().Bytes, items["model_type"].Value().Pos)
                model_type = model_type.Value().decode()
            kind = litertlm_core.any_section_data_type_to_string(section.DataType())
            sections.append((kind, model_type, section.BeginOffset(), section.EndOffset()))
    except Exception as error:  # a flatbuffer with garbage offsets fails in many ways
        raise ValueError(f"{path} is corrupt: its header cannot be read ({type(error).__name__}: {error}).") from error
    for kind, _, begin, end in sections:
        if not begin <= end <= size:
            raise ValueError(
                f"{path} is truncated or corrupt: its {kind} section ends at byte {end}, "
                f"past the end of the file ({size} bytes)."
            )
    kinds = {kind for kind, *_ in sections}
    missing = {"TFLiteModel", "LlmMetadataProto"} - kinds
    if missing or not kinds & {"HF_Tokenizer_Zlib", "SP_Tokenizer"}:
        raise ValueError(f"{path} is not a complete LiteRT-LM bundle: it has sections {sorted(kinds)}.")
    return sections


def read_metadata(path):
    """The bundle's `LlmMetadata` proto (after `read_sections`' checks)."""
    from litert_lm_builder.runtime.proto import llm_metadata_pb2

    ((begin, end),) = [(b, e) for kind, _, b, e in read_sections(path) if kind == "LlmMetadataProto"]
    metadata = llm_metadata_pb2.LlmMetadata()
    metadata.ParseFromString(_read(path, begin, end))
    return metadata


def read_tflite_model(path):
    """The bytes of the bundle's prefill/decode TFLite model."""
    sections = read_sections(path)
    ((begin, end),) = [(b, e) for kind, model_type, b, e in sections if kind == "TFLiteModel"]
    return _read(path, begin, end)


def _read(path, begin, end):
    with open(path, "rb") as file:
        file.seek(begin)
        return file.read(end - begin)


def teacher_forced_logits(tflite_model, token_ids, num_threads=2, work_dir=None):
    """The next-token logits `(T, V)` at every position of `token_ids` (T ints), computed by
    the `decode` signature of a bundle's TFLite model one token at a time in LiteRT: what the
    runtime computes, without its sampler. Given rows `(N, T)`, the logits `(N, T, V)`, each row
    from an empty cache (`teacher_forced_rows`, which gives one row at a time)."""
    import numpy as np

    token_ids = np.asarray(token_ids)
    rows = token_ids.reshape(-1, token_ids.shape[-1])
    logits = None
    for i, row in enumerate(teacher_forced_rows(tflite_model, rows, num_threads, work_dir)):
        if logits is None:  # filled in place: a real vocabulary's are gigabytes
            logits = np.empty((len(rows), *row.shape), np.float32)
        logits[i] = row
    return logits.reshape(*token_ids.shape, -1)


def teacher_forced_rows(tflite_model, rows, num_threads=2, work_dir=None):
    """Yields `teacher_forced_logits` of each of the int `rows` `(N, T)` in turn, `(T, V)`, each
    from an empty cache, the model compiled once for all of them (each compilation packs a copy
    of the weights); a caller that compares each row as it comes holds one row's logits, not N.
    `tflite_model` is the model's bytes or the path of its file (`compiled_model`)."""
    with compiled_model(tflite_model, num_threads, work_dir) as model:
        yield from decoded_rows(model, rows)


@contextlib.contextmanager
def compiled_model(tflite_model, num_threads=2, work_dir=None):
    """The TFLite model `tflite_model` (its bytes or the path of its file) compiled in LiteRT for
    the CPU, closed on exit.

    Its weights are packed for the CPU into an XNNPACK weight cache in a temporary file (in
    `work_dir`, else the system's temporary folder), as LiteRT-LM does with a cache folder: the
    packed weights are then a file mapping the kernel can page out, not more copies of the
    weights in the process's own memory. LiteRT logs as it makes and frees the model
    (`kzoo.logs.captured_stderr` keeps that out of kzoo's output)."""
    import ai_edge_litert
    from ai_edge_litert.compiled_model import CompiledModel
    from ai_edge_litert.environment import Environment
    from ai_edge_litert.options import CpuOptions
    from ai_edge_litert.options import Options

    with tempfile.TemporaryDirectory(prefix="kzoo-xnnpack-", dir=work_dir) as folder:
        # Its own environment, closed here: the default one lives until the process exits, and logs then.
        environment = Environment.create(runtime_path=str(Path(ai_edge_litert.__file__).parent))
        cache = str(Path(folder) / "weights.xnnpack_cache")
        options = Options(cpu_options=CpuOptions(num_threads=num_threads, xnnpack_weight_cache_path=cache))
        if isinstance(tflite_model, (str, os.PathLike)):
            model = CompiledModel.from_file(str(tflite_model), environment=environment, options=options)
        else:
            model = CompiledModel.from_buffer(bytes(tflite_model), environment=environment, options=options)
        try:
            yield model
        finally:
            model.close()
            environment.close()


def decoded_rows(model, rows):
    """The logits `(T, V)` of each of the int `rows` `(N, T)` in turn, computed by the compiled
    `model`'s `decode` signature a token at a time from an empty cache.

    As LiteRT-LM's CPU executor does, one buffer holds each `kv_cache_*` tensor, bound as the
    signature's input and as its output of the same name, so that each step updates the cache
    in place; passing the cache in and out as arrays copies all of it at every step, a cost
    that grows with the square of the cache length over a whole row."""
    import numpy as np

    inputs, outputs, size = _bound(model, "decode")
    for row in np.asarray(rows):
        _empty_cache(model, "decode", inputs)
        row_logits = np.empty((len(row), size), np.float32)
        for position, token in enumerate(row):
            inputs["tokens"].write(np.asarray([[token]], np.int32))
            inputs["input_pos"].write(np.asarray([position], np.int32))
            model.run_by_name("decode", inputs, outputs)
            row_logits[position] = outputs["logits"].read(size, np.float32)
        yield row_logits


def chunked_rows(model, rows, signature):
    """`decoded_rows`, computed a chunk of N positions at a time by the compiled `model`'s
    `signature`, a prefill chunk that returns its logits `(1, N, V)`
    (`kzoo.export.litertlm.TEACHER_FORCED`): each run reads the weights once for N positions.
    A row's last chunk ends at its end, starting earlier where the row's length is no multiple
    of N (the positions computed again write the cache as they did before); a row shorter than
    N is padded with token 0 after its end, which no position of the row attends to."""
    import numpy as np

    inputs, outputs, size = _bound(model, signature)
    chunk = int(model.get_input_tensor_details(signature)["tokens"]["shape"][-1])
    for row in np.asarray(rows):
        _empty_cache(model, signature, inputs)
        row_logits = np.empty((len(row), size), np.float32)
        for start in range(0, len(row), chunk):
            start = max(0, min(start, len(row) - chunk))
            tokens = np.zeros(chunk, np.int32)
            part = row[start : start + chunk]
            tokens[: len(part)] = part
            inputs["tokens"].write(tokens[None])
            inputs["input_pos"].write(np.arange(start, start + chunk, dtype=np.int32))
            model.run_by_name(signature, inputs, outputs)
            row_logits[start : start + len(part)] = (
                outputs["logits"].read(chunk * size, np.float32).reshape(chunk, size)[: len(part)]
            )
        yield row_logits


def _bound(model, signature):
    """The input buffers of `signature`, its outputs (`logits`, and the `kv_cache_*` inputs bound
    as the outputs of the same name) and the vocabulary size."""
    inputs = {
        name: model.create_input_buffer_by_name(signature, name) for name in model.get_input_tensor_details(signature)
    }
    outputs = {name: buffer for name, buffer in inputs.items() if name.startswith("kv_cache_")}
    outputs["logits"] = model.create_output_buffer_by_name(signature, "logits")
    return inputs, outputs, int(model.get_output_tensor_details(signature)["logits"]["shape"][-1])


def _empty_cache(model, signature, inputs):
    """Zeros into the input buffers `inputs` of `signature`: an empty cache."""
    import numpy as np

    for name, tensor in model.get_input_tensor_details(signature).items():
        inputs[name].write(np.zeros(tensor["shape"], tensor["dtype"]))
