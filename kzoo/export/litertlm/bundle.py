"""What a `.litertlm` bundle holds besides its signatures, and the file itself: the model made
in one of `CONVERSIONS`, the chat template as the runtime renders it, the `LlmMetadata` and the
file packed with litert-lm-builder."""

import dataclasses
import json
import os
import tempfile
from pathlib import Path

from kzoo import files
from kzoo.export.tflite.convert import TFLITE_FORMATS
from kzoo.export.tflite.convert import convert
from kzoo.export.tflite.quantize import QUANTIZATIONS
from kzoo.export.tflite.quantize import quantize

# How a bundle's model is made: float32 converted, and for the quantized bundles then quantized
# by ai-edge-quantizer (`kzoo.export.tflite.quantize`).
CONVERSIONS = {"tflite_fp32": TFLITE_FORMATS["tflite_fp32"], **QUANTIZATIONS}


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
        tflite_model: the TFLite model (`RuntimeSignatures` converted): its bytes, or the path
            of its file (copied into the bundle, never read into memory whole).
        tokenizer_json: str, the Hugging Face `tokenizer.json` text.
        metadata: the `LlmMetadata` proto (`llm_metadata`).
    """
    from litert_lm_builder import litertlm_builder

    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        model_file = folder / "model.tflite"
        if isinstance(tflite_model, (str, os.PathLike)):
            model_file = Path(tflite_model)
        else:
            model_file.write_bytes(tflite_model)
        (folder / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
        (folder / "llm_metadata.pb").write_bytes(metadata.SerializeToString())
        builder = litertlm_builder.LitertLmFileBuilder()
        builder.add_tflite_model(str(model_file), litertlm_builder.TfLiteModelType.PREFILL_DECODE)
        builder.add_hf_tokenizer(str(folder / "tokenizer.json"))
        builder.add_llm_metadata(str(folder / "llm_metadata.pb"))
        with files.atomic_file(path) as file:  # whole, or not at all
            builder.build(file)
