"""The serving signatures of a kzoo model, traced once, over one copy of its variables."""

import functools
import json

import numpy as np
import tensorflow as tf

from kzoo import files
from kzoo import models
from kzoo.models import TiedLogits
from kzoo.models import generation
from kzoo.samplers import GreedySampler

# What `serving_default` returns per model class: "lm" logits only,
# "classifier" logits and softmax probabilities, "tagger" logits and argmax tags.
TASKS = {
    models.GPTCausalLM: "causal_lm",
    models.Seq2SeqTransformer: "seq2seq",
    models.RNNLanguageModel: "lm",
    models.FeedForwardLanguageModel: "lm",
    models.BertMaskedLM: "lm",
    models.BertClassifier: "classifier",
    models.BiLSTMClassifier: "classifier",  # or "tagger": see `serving_task`
    models.BertTokenClassifier: "tagger",
}

# The tasks with the serving interface of `kzoo.models.generation` (`prefill`, `decode`).
GENERATING = ("causal_lm", "seq2seq")

# The signature that takes raw strings, per task, when the model carries a tokenizer.
TEXT_SIGNATURES = {"classifier": "classify_text", "causal_lm": "generate_text", "seq2seq": "generate_text"}

# Keras' recurrent layers lower to a TFLite WHILE loop only with a static
# batch, so their TFLite `serving_default` takes batch 1.
RECURRENT = (models.RNNLanguageModel, models.BiLSTMClassifier)

# The length checked as "full" for models without a position table (RNNs, the
# feed-forward LM).
DEFAULT_MAX_LENGTH = 128
# The KV cache of an exported generating model when no `cache_length` is given: its context,
# capped here. A real checkpoint's context (8,192 for SmolLM2, 32,768 for Qwen2.5) would make
# every exported cache, and every step that reads it, that long unasked.
DEFAULT_CACHE_LENGTH = 4096
# What a server checks its inputs against (`ServingSignatures.info`): the name of the TFLite
# metadata entry, and of the file in a SavedModel's `assets.extra/`.
INFO_NAME = "kzoo_model"
INFO_FILE = "kzoo_model.json"


def task_of(model):
    """The serving task of a kzoo model ("causal_lm", "seq2seq", "lm", "classifier", "tagger")."""
    if getattr(model, "serving_task", None):  # a model that can be either says which
        return model.serving_task
    for cls, task in TASKS.items():
        if isinstance(model, cls):
            return task
    supported = ", ".join(sorted(cls.__name__ for cls in TASKS))
    raise ValueError(f"Cannot export a {type(model).__name__}: supported models are {supported}.")


def max_length_of(model):
    """The longest sequence the model takes: its position table, or `DEFAULT_MAX_LENGTH`."""
    backbone = getattr(model, "backbone", None)
    return getattr(backbone, "max_sequence_length", None) or DEFAULT_MAX_LENGTH


def vocabulary_size_of(model):
    return getattr(getattr(model, "backbone", None), "vocabulary_size", None) or model.vocabulary_size


def input_names(model):
    """The model's input names in call order; a single-input model takes "token_ids"."""
    return list(model.input) if isinstance(model.input, dict) else ["token_ids"]


def classifier_special_ids(tokenizer):
    """The `[CLS]` and `[SEP]` ids a classifier's text is wrapped in, from the tokenizer (a
    Hugging Face vocabulary has them at 101 and 102); `(None, None)` for a tokenizer without
    them (a character tokenizer), whose text is not wrapped."""
    from kzoo.tokenizers import packing

    try:
        return tuple(packing.special_token_id(tokenizer, name) for name in ("cls_token", "sep_token"))
    except ValueError:
        return None, None


def seq2seq_special_ids(tokenizer):
    """The `[BOS]` a seq2seq decoder starts from and the `[EOS]` it stops at, from the tokenizer."""
    from kzoo.tokenizers import packing

    return tuple(packing.special_token_id(tokenizer, name) for name in ("bos_token", "eos_token"))


def check_cache_length(model, cache_length=None):
    """The KV cache length of a generating model's exported files: `cache_length`, by default
    the model's maximum sequence length capped at `DEFAULT_CACHE_LENGTH`; raises ValueError
    outside [2, that maximum]."""
    limit = max_length_of(model)
    integer = isinstance(cache_length, (int, np.integer)) and not isinstance(cache_length, bool)
    if cache_length is not None and not (integer and 1 < cache_length <= limit):
        raise ValueError(
            f"`cache_length` ({cache_length!r}) must be an int in [2, {limit}], the model's maximum sequence length."
        )
    return int(cache_length or min(limit, DEFAULT_CACHE_LENGTH))


def call_model(model, names, inputs):
    """The Keras model on `{name: tensor}` (a single-input model takes the tensor)."""
    inputs = {name: inputs[name] for name in names}
    return model(inputs if len(names) > 1 else inputs["token_ids"], training=False)


class ServingSignatures:
    """The serving signatures of a kzoo model and the variables they read.

    `save(path)` writes a SavedModel with the SavedModel signatures that holds
    each variable once (Keras 3.15's `model.export` writes every variable
    twice, keras-team/keras#23553): the SavedModel's root is a `tf.Module`
    with only the variables, and the Keras model is only captured by the
    traced functions, never tracked. `tflite_functions()` gives the concrete
    functions the TFLite converter takes.

    SavedModel signatures, batch and sequence length dynamic, int32 inputs
    named as the model's own inputs:

    - `serving_default`: `{"logits"}` float32 for language models, plus
      `"probabilities"` (softmax) for classifiers or `"tags"` (argmax, int32)
      for taggers.
    - `generate` (GPTCausalLM, Seq2SeqTransformer): greedy decoding in one
      compiled `tf.while_loop` over the KV cache (kzoo's `GreedySampler`).
      GPT: `token_ids`, `padding_mask` `(B, L)`: prompts right-padded to the
      total length L, mask 1 on prompt tokens. Seq2seq: `encoder_token_ids`
      `(B, S)` and `decoder_token_ids` `(B, L)`: the decoder prompt (e.g.
      [BOS]) right-padded with 0 to L. Both take `stop_token_ids` `(N,)`
      (possibly empty) and return `{"token_ids", "padding_mask"}` `(B, L)`,
      the mask 1 on prompt and generated tokens (a row stops after a stop
      token). Every row needs at least one prompt token.

    With a `tokenizer` (the keras-hub tokenizer saved beside the model), one
    more signature takes raw strings `text` `(B,)` and tokenizes inside the
    graph (a WordPiece tokenizer's ops come from `tensorflow_text`, which a
    server imports before loading):

    - `classify_text` (classifiers): `[CLS] tokens [SEP]`, cut to the
      model's maximum length, as `kzoo.data.classification_batches` packs
      them; returns `logits`, `probabilities` and the argmax `label`.
    - `generate_text` (GPTCausalLM): continues each prompt greedily by up to
      `max_new_tokens` (scalar int32) tokens within the model's maximum
      length, stopping a row at any of `stop_token_ids`; returns `text`, the
      prompt and its continuation.
    - `generate_text` (Seq2SeqTransformer): the decoder starts from `[BOS]`
      and stops at `[EOS]` (their ids in the tokenizer, as `kzoo.data.seq2seq_batches`
      trains) after at most `max_new_tokens`; returns `text`, the output
      without `[BOS]`/`[EOS]`.

    TFLite adds, for the generating models, `prefill` and `decode` with the
    KV cache as explicit fixed-size state, batch 1: `prefill` runs the prompt
    (`token_ids` `(1, P)`, seq2seq: `encoder_token_ids` `(1, S)` and
    `decoder_token_ids` `(1, P)`) into an empty cache of `cache_length`
    positions; `decode` runs one token (`token_ids` `(1, 1)`) at
    `cache_index`. Both return the `logits` `(1, V)` of the next token and
    the state (`key_cache_i`, `value_cache_i` per block; seq2seq also
    `cross_key_cache_i`, `cross_value_cache_i` and `encoder_padding_mask`),
    which the caller feeds back into `decode` under the same names
    (`kzoo.export.LiteRTModel.generate` does).

    Args:
        model: a kzoo task model (see `TASKS`).
        cache_length: int, the positions of the TFLite KV cache; defaults to
            the model's maximum sequence length.
        tokenizer: None, or the model's keras-hub tokenizer, for the
            signature that takes raw strings (`TEXT_SIGNATURES`).

    Example:
    >>> signatures = ServingSignatures(keras.saving.load_model("lm.keras"))
    >>> signatures.save("lm_savedmodel")
    """

    def __init__(self, model, cache_length=None, tokenizer=None):
        self.task = task_of(model)
        self.input_names = input_names(model)
        # The token table is also the output projection (GPT, tied seq2seq, BERT MLM).
        self.tied_embeddings = any(isinstance(layer, TiedLogits) for layer in model.layers)
        self.cache_length = check_cache_length(model, cache_length)
        self._info = {
            "task": self.task,
            "vocabulary_size": int(vocabulary_size_of(model)),
            "max_sequence_length": getattr(getattr(model, "backbone", None), "max_sequence_length", None),
        }
        self._functions = _signature_functions(model, self.task, self.input_names, self.cache_length)
        self.tokenizer = tokenizer if self.task in TEXT_SIGNATURES else None
        if self.tokenizer is not None:
            self._functions[self.text_signature] = _text_function(
                model, self.task, self.input_names, self._functions, tokenizer
            )

    @functools.cached_property
    def variables(self):
        """The variables every signature reads, each once. Tracing each signature to find them is
        what a SavedModel needs; a TFLite file traces only its own functions, so this waits until
        asked."""
        return captured_variables([function.get_concrete_function() for function in self._functions.values()])

    @property
    def info(self):
        """What a server needs to check its inputs: `{"task", "vocabulary_size",
        "max_sequence_length", "cache_length"}` (the last one None without generation).
        Saved with the SavedModel (`assets.extra/kzoo_model.json`) and in the TFLite files'
        metadata (`kzoo_model`), where `kzoo.export.LiteRTModel` reads it."""
        return dict(self._info, cache_length=self.cache_length if self.generates else None)

    @property
    def generates(self):
        """Whether the model has `generate`, `prefill` and `decode` signatures."""
        return "generate" in self._functions

    @property
    def text_signature(self):
        """The name of the signature that takes raw strings, or None without a tokenizer."""
        return TEXT_SIGNATURES[self.task] if self.tokenizer is not None else None

    def savedmodel_signatures(self):
        """`{name: tf.function}`: `serving_default`, and `generate` and the text signature if any."""
        names = ("serving_default", "generate", self.text_signature)
        return {name: self._functions[name] for name in names if name in self._functions}

    def save(self, path):
        """Writes the SavedModel of `savedmodel_signatures()` to `path`, with `info` in
        `path/assets.extra/kzoo_model.json`."""
        with files.atomic_folder(path, overwrite=True) as staging:  # whole, or not at all
            tf.saved_model.save(self.trackable(), str(staging), signatures=self.savedmodel_signatures())
            (staging / "assets.extra").mkdir(exist_ok=True)
            (staging / "assets.extra" / INFO_FILE).write_text(json.dumps(self.info, indent=2), encoding="utf-8")

    def trackable(self):
        """A `tf.Module` holding the variables once (and the tokenizer's
        resources): what the SavedModel saves the signatures' captures from."""
        root = tf.Module(name="kzoo_serving")
        root.model_variables = list(self.variables)
        if self.tokenizer is not None:
            root.tokenizer = self.tokenizer
        return root

    def tflite_functions(self, generation=True):
        """Concrete functions for `tf.lite.TFLiteConverter.from_concrete_functions`:
        `serving_default`, and `prefill` and `decode` for the generating models
        when `generation` is True."""
        names = ["tflite_serving_default"]
        if generation and self.generates:
            names += ["prefill", "decode"]
        return [self._functions[name].get_concrete_function() for name in names]


def captured_variables(concrete_functions):
    """The variables the functions read, each once, in a stable order."""
    seen, variables = set(), []
    for function in concrete_functions:
        for variable in function.variables:
            if id(variable) not in seen:
                seen.add(id(variable))
                variables.append(variable)
    return variables


def _ids_spec(name, batch=None, length=None):
    """An int32 `(batch, length)` input named `name`; None is dynamic."""
    return tf.TensorSpec([batch, length], tf.int32, name=name)


def _signature_functions(model, task, names, cache_length):
    """`{name: tf.function}` for every signature of `model` (see `ServingSignatures`).

    The model's functions are traced without AutoGraph: kzoo's layers are `keras.ops` code
    that also runs under `jax.jit`, so converting them yields the same graph, only later."""

    def heads(logits):
        if task == "classifier":
            return {"logits": logits, "probabilities": tf.nn.softmax(logits, axis=-1)}
        if task == "tagger":
            return {"logits": logits, "tags": tf.argmax(logits, axis=-1, output_type=tf.int32)}
        return {"logits": logits}

    def serving(batch):
        specs = [_ids_spec(name, batch) for name in names]

        @tf.function(input_signature=specs, autograph=False)
        def serving_default(*inputs):
            return heads(call_model(model, names, dict(zip(names, inputs))))

        return serving_default

    functions = {"serving_default": serving(None)}
    functions["tflite_serving_default"] = serving(1) if isinstance(model, RECURRENT) else functions["serving_default"]
    if task in GENERATING:
        functions.update(_generation_functions(model, names, cache_length))
    return functions


def state_specs(prefill):
    """TensorSpecs of the decoding state that the `tf.function` `prefill` (with an input
    signature) returns beside its "logits", named as the model names the entries (e.g.
    `key_cache_0`); a length that depends on an input (a source's) stays dynamic."""
    outputs = prefill.get_concrete_function().structured_outputs
    return [tf.TensorSpec(t.shape, t.dtype, name=name) for name, t in sorted(outputs.items()) if name != "logits"]


def _generation_functions(model, names, cache_length):
    """`generate`, `prefill` and `decode`, all built on the model's serving interface
    (`split_generation_inputs`, `prefill`, `decode`; see `kzoo.models.generation`)."""
    # Made outside the traced function: a sampler owns a (here unused) seed variable.
    sampler = GreedySampler()
    stop_spec = tf.TensorSpec([None], tf.int32, name="stop_token_ids")

    @tf.function(input_signature=[*(_ids_spec(name) for name in names), stop_spec], autograph=False)
    def generate(*inputs):
        *inputs, stop_token_ids = inputs
        token_ids, prompt_mask, context = model.split_generation_inputs(dict(zip(names, inputs)))
        prefill = tf.reduce_min(tf.reduce_sum(tf.cast(prompt_mask, tf.int32), axis=1))
        noise = tf.zeros((tf.shape(token_ids)[1], tf.shape(token_ids)[0]))  # greedy draws no random numbers
        token_ids, generated = generation.decode_loop(
            model, sampler, token_ids, prompt_mask, prefill, stop_token_ids, noise, context
        )
        return {"token_ids": token_ids, "padding_mask": tf.cast(tf.logical_or(generated, prompt_mask), tf.int32)}

    # TFLite's prefill takes the prompt alone (batch 1, no padding) and the context, under the
    # model's input names.
    prompt_name, context_names = _prompt_and_context_names(model, names)
    prefill_names = [*context_names, prompt_name]

    @tf.function(input_signature=[_ids_spec(name, 1) for name in prefill_names], autograph=False)
    def prefill(*inputs):
        *context, prompt = inputs
        logits, state = model.prefill(prompt, cache_length, last_only=True, **dict(zip(context_names, context)))
        return {"logits": logits[:, -1], **state}

    specs = state_specs(prefill)
    fixed_specs = [_ids_spec("token_ids", 1, 1), tf.TensorSpec([], tf.int32, name="cache_index")]

    @tf.function(input_signature=[*fixed_specs, *specs], autograph=False)
    def decode(token_ids, cache_index, *state):
        state = {spec.name: tensor for spec, tensor in zip(specs, state)}
        logits, new_state = model.decode(token_ids, state, cache_index)
        # What the step only reads (a seq2seq model's cross-attention caches) is not an output:
        # the caller passes its input on.
        updated = {name: tensor for name, tensor in new_state.items() if tensor is not state[name]}
        return {"logits": logits[:, -1], **updated}

    return {"generate": generate, "prefill": prefill, "decode": decode}


def _prompt_and_context_names(model, names):
    """The name of the prompt among the model's inputs and the names of `prefill`'s context."""
    symbolic = {name: tf.zeros([1, 1], tf.int32) for name in names}
    prompt, _, context = model.split_generation_inputs(symbolic)
    prompt_name = next(name for name, tensor in symbolic.items() if tensor is prompt)
    return prompt_name, [name for name in names if name in context]


def _text_function(model, task, names, functions, tokenizer):
    """The signature of `task` that takes raw strings (see `ServingSignatures`)."""
    # kzoo.data imports tensorflow-datasets: only here.
    from kzoo.data.pipelines import tokenize

    max_length = max_length_of(model)
    text_spec = tf.TensorSpec([None], tf.string, name="text")
    new_tokens_spec = tf.TensorSpec([], tf.int32, name="max_new_tokens")

    def token_ids(text):
        return tokenize(tokenizer, text)  # (B, None)

    def detokenize(ids, keep):
        return tf.reshape(tokenizer.detokenize(tf.ragged.boolean_mask(ids, keep)), [-1])

    def check_new_tokens(max_new_tokens):
        return tf.debugging.assert_positive(max_new_tokens, message="`max_new_tokens` must be >= 1.")

    if task == "classifier":
        cls_id, sep_id = classifier_special_ids(tokenizer)

        @tf.function(input_signature=[text_spec])
        def classify_text(text):
            ids = token_ids(text)
            if cls_id is not None:  # [CLS] tokens [SEP]; a tokenizer without them: the tokens alone
                column = tf.ones([ids.nrows(), 1], tf.int32)
                ids = tf.concat([column * cls_id, ids[:, : max_length - 2], column * sep_id], axis=1)
            ids = ids[:, :max_length].to_tensor()  # (B, T)
            inputs = {"token_ids": ids, "segment_ids": tf.zeros_like(ids), "padding_mask": tf.cast(ids != 0, tf.int32)}
            logits = call_model(model, names, inputs)
            return {
                "logits": logits,
                "probabilities": tf.nn.softmax(logits, axis=-1),
                "label": tf.argmax(logits, axis=-1, output_type=tf.int32),
            }

        return classify_text

    def generate(stop_token_ids, **inputs):  # the `generate` signature, with its inputs by name
        return functions["generate"](*(inputs[name] for name in names), stop_token_ids)

    if task == "causal_lm":
        stop_spec = tf.TensorSpec([None], tf.int32, name="stop_token_ids")

        @tf.function(input_signature=[text_spec, new_tokens_spec, stop_spec])
        def generate_text(text, max_new_tokens, stop_token_ids):
            ids = token_ids(text)
            lengths = ids.row_lengths()
            longest = tf.cast(tf.reduce_max(lengths), tf.int32)
            with tf.control_dependencies(
                [
                    check_new_tokens(max_new_tokens),
                    tf.debugging.assert_positive(lengths, message="Every prompt needs at least one token."),
                    tf.debugging.assert_less(
                        longest,
                        max_length,
                        message=f"A prompt must have fewer tokens than the model's maximum length {max_length}.",
                    ),
                ]
            ):
                shape = tf.stack([ids.nrows(out_type=tf.int32), tf.minimum(longest + max_new_tokens, max_length)])
            outputs = generate(
                token_ids=ids.to_tensor(shape=shape),
                padding_mask=tf.ones_like(ids).to_tensor(shape=shape),
                stop_token_ids=stop_token_ids,
            )
            return {"text": detokenize(outputs["token_ids"], outputs["padding_mask"] > 0)}

        return generate_text

    bos_id, eos_id = seq2seq_special_ids(tokenizer)

    @tf.function(input_signature=[text_spec, new_tokens_spec])
    def generate_seq2seq_text(text, max_new_tokens):
        sources = token_ids(text)[:, :max_length].to_tensor()
        with tf.control_dependencies([check_new_tokens(max_new_tokens)]):
            length = tf.minimum(1 + max_new_tokens, max_length)
        starts = tf.pad(tf.fill([tf.shape(sources)[0], 1], bos_id), [[0, 0], [0, length - 1]])  # [BOS] 0 0 ...
        outputs = generate(encoder_token_ids=sources, decoder_token_ids=starts, stop_token_ids=tf.constant([eos_id]))
        ids = outputs["token_ids"]
        keep = (outputs["padding_mask"] > 0) & (ids != bos_id) & (ids != eos_id)
        return {"text": detokenize(ids, keep)}

    return generate_seq2seq_text
