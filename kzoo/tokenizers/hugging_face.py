"""`HFTokenizer`: a Hugging Face `tokenizer.json` run by the `tokenizers` package, as a Keras layer.

The Llama lineage (Llama, Mistral, Qwen, SmolLM, Gemma) tokenizes with its `tokenizer.json` as it
is: `HFTokenizer` runs it with the `tokenizers` package, so its ids are transformers' fast
tokenizer's, and carries the named special tokens and the chat template beside. A panic of the
`tokenizers` package (its Rust code giving up) becomes a `ValueError` naming the file and its
regex patterns. `kzoo.checkpoints.hf.tokenizer_files` reads one from a Hugging Face folder and
writes it back, `kzoo.checkpoints.gguf.tokenizer` from a GGUF file.

The tokenizer is a Keras layer with keras-hub's tokenizer interface (`tokenize`, `detokenize`,
`vocabulary_size`, `token_to_id`, the special tokens' ids): a task holds one (`Task.tokenizer`)
and `.keras` files keep it, its `tokenizer.json` included. It imports neither keras-hub nor
TensorFlow: keras-hub imports TensorFlow wherever it is installed (3-4 s), and this tokenizer
needs TensorFlow only for TensorFlow's own inputs (string tensors, a `tf.data` map), which exist
only once TensorFlow is imported. Importing this module imports `tokenizers`, so kzoo does it only
where tokenizers are read or written.
"""

import contextlib
import json
import warnings
from pathlib import Path

import keras
import numpy as np
import tokenizers

from kzoo import _compat
from kzoo.tokenizers import byte_pair
from kzoo.tokenizers.chat_template import render_chat_template
from kzoo.validation import imported_tensorflow

# The file of a `tokenizers` pipeline: in a Hugging Face folder, and among a `.keras` file's assets.
TOKENIZER_FILE = "tokenizer.json"
# transformers' named special tokens (`SPECIAL_TOKENS_ATTRIBUTES`).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _token_id(name):
    """The property `<name>_id`: the id of the named special token, or None when it is not set."""

    def token_id(self):
        token = getattr(self, name)
        return None if token is None else self.token_to_id(token)

    return property(token_id, doc=f"The id of `{name}`, or None.")


@keras.saving.register_keras_serializable(package="kzoo")
class HFTokenizer(keras.layers.Layer):
    """A Hugging Face `tokenizer.json` as a Keras layer, with the ids of the `tokenizers` package.

    The tokenizer of a Hugging Face checkpoint is its `tokenizer.json`: normalizer, pre-tokenizer,
    BPE / WordPiece / Unigram model, added tokens, decoder. This layer runs that file with the
    `tokenizers` package itself, so its ids are `tokenizers`' (and transformers' fast tokenizer's)
    on any text, and it carries what a chat model needs beside: the named special tokens and the
    chat template. `.keras` files keep the `tokenizer.json` as an asset.

    `tokenize` gives the ids of the text alone (`tokenizers`' `add_special_tokens=False`, as
    transformers tokenizes a rendered chat): no BOS before it, no EOS after it. `start_token_id` is
    the BOS the checkpoint's tokenizer prepends when it adds special tokens (None if it prepends
    nothing); a causal LM puts it before a prompt. Special and added tokens written in the text
    ("<|im_end|>") are kept whole, as in `tokenizers`.

    Eager calls answer as keras-hub's tokenizers do: a string gives a NumPy int32 array, a list of
    strings a list of id lists; `detokenize` gives a string (a list of strings for a batch). In a
    `tf.data` map or a `tf.function` it is a `tf.py_function`: a string tensor gives int32 ids
    (a `tf.RaggedTensor` for a batch) and `detokenize` a string tensor. A graph that holds it
    runs only in the Python process that traced it: a SavedModel signature with it saves, but
    fails in any other process ("Could not find callback with key=pyfunc_0"), and TFLite cannot
    convert it. Serve token ids and ship the `tokenizer.json` (`kzoo.tokenizers.tokenizer_json`).

    Args:
        tokenizer: a `tokenizers.Tokenizer`, the `tokenizer.json` text, or its path; None leaves it
            to `load_assets` (a `.keras` file).
        bos_token, eos_token, unk_token, sep_token, pad_token, cls_token, mask_token: str or None,
            the named special tokens (transformers' names); each must be in the vocabulary, and is
            kept whole in text.
        chat_template: str or None, the Jinja chat template (see `kzoo.tokenizers.chat_template`).
        tokenizer_source: str or None, where the tokenizer comes from (its file), named in its
            errors and warnings; default: the path given as `tokenizer`.
        config_file: ignored: the configs of `.keras` files written when this layer was a keras-hub
            tokenizer carry it.
        **kwargs: `keras.layers.Layer` arguments (`name`, ...).

    Raises:
        ValueError: as `set_tokenizer`; and from `tokenize` / `detokenize` where the `tokenizers`
            package panics on a text (a regex pattern of the file that backtracks past the
            regex engine's limit), naming the file and its patterns.

    Example:
    >>> backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({"hello": 0, "world": 1, "[UNK]": 2}, "[UNK]"))
    >>> backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    >>> tokenizer = HFTokenizer(backend, unk_token="[UNK]")
    >>> tokenizer("hello big world").tolist()
    [0, 2, 1]
    >>> tokenizer(["hello", "world [UNK]"])
    [[0], [1, 2]]
    >>> tokenizer.detokenize([0, 1])
    'hello world'
    """

    def __init__(
        self,
        tokenizer=None,
        bos_token=None,
        eos_token=None,
        unk_token=None,
        sep_token=None,
        pad_token=None,
        cls_token=None,
        mask_token=None,
        chat_template=None,
        tokenizer_source=None,
        config_file=None,
        **kwargs,
    ):
        kwargs.setdefault("dtype", "int32")
        super().__init__(**kwargs)
        _compat.takes_raw_inputs(self)
        self.bos_token, self.eos_token, self.unk_token, self.sep_token = bos_token, eos_token, unk_token, sep_token
        self.pad_token, self.cls_token, self.mask_token = pad_token, cls_token, mask_token
        self.chat_template = chat_template
        # Where the template came from, named in its errors (readers set a file).
        self.chat_template_source = "the tokenizer's chat_template"
        self.tokenizer_source = tokenizer_source
        self._backend = None
        # Nothing to build; and Keras' `quantize` refuses a model with a layer that is not built.
        self.built = True
        if tokenizer is not None:
            self.set_tokenizer(tokenizer)

    def set_tokenizer(self, tokenizer, copy=True):
        """Sets the `tokenizers.Tokenizer` (or `tokenizer.json` text or path) this layer runs.

        A `tokenizers.Tokenizer` is copied unless `copy` is False: then this layer takes it over
        (and adds its special tokens to it), which spares rebuilding a large vocabulary for a
        caller that made it for this layer alone.

        A byte-fallback BPE (SentencePiece-style) whose vocabulary lacks some of its 256 byte
        tokens `<0x00>`..`<0xFF>` is kept, with a warning naming the file: a character outside
        the vocabulary whose bytes are missing becomes the unknown token, or is dropped.

        Raises:
            ValueError: if its ids are not 0..n-1, a named special token is not in it, its
                post-processor puts more than one token before the text, or the `tokenizers`
                package panics on it (naming the file).
        """
        is_text = isinstance(tokenizer, str) and tokenizer.lstrip().startswith("{")
        if self.tokenizer_source is None and isinstance(tokenizer, (str, Path)) and not is_text:
            self.tokenizer_source = str(tokenizer)
        with _panics_as_errors(self._source, "reading it"):
            if isinstance(tokenizer, tokenizers.Tokenizer):
                backend = tokenizers.Tokenizer.from_str(tokenizer.to_str()) if copy else tokenizer
            elif is_text:
                backend = tokenizers.Tokenizer.from_str(tokenizer)
            elif isinstance(tokenizer, (str, Path)):
                backend = tokenizers.Tokenizer.from_file(str(tokenizer))
            else:
                raise ValueError(
                    "`tokenizer` must be a `tokenizers.Tokenizer`, a tokenizer.json text or its path; "
                    f"received a {type(tokenizer).__name__}."
                )
        # Ids as the file spells them, whatever padding or truncation it was saved with.
        backend.no_padding()
        backend.no_truncation()
        size = backend.get_vocab_size(with_added_tokens=True)
        ids = sorted(backend.get_vocab(with_added_tokens=True).values())
        if ids != list(range(size)):
            raise ValueError(
                f"The tokenizer's ids must be 0..{size - 1} without gaps; they run from {ids[0]} to {ids[-1]}."
            )
        missing = {name: token for name, token in self.special_tokens_map.items() if backend.token_to_id(token) is None}
        if missing:
            raise ValueError(f"The special tokens {missing} are not in the tokenizer's vocabulary of {size} tokens.")
        # Kept whole in text, as transformers keeps them.
        byte_pair.add_tokens(backend, named=self.special_tokens_map.values())
        _warn_of_missing_byte_tokens(backend, self._source)
        # The tokens the post-processor puts before the text (`sequence_ids` None: not the text's).
        with _panics_as_errors(self._source, "tokenizing 'a'", backend):
            encoding = backend.encode("a", add_special_tokens=True)
        prefix = []
        for token_id, sequence in zip(encoding.ids, encoding.sequence_ids):
            if sequence is not None:
                break
            prefix.append(token_id)
        if len(prefix) > 1:
            raise ValueError(
                f"The tokenizer's post-processor puts {len(prefix)} tokens before the text; kzoo takes one."
            )
        self._backend = backend
        self._start_token_id = prefix[0] if prefix else None
        self._vocabulary = None

    @property
    def _source(self):
        """The tokenizer's file (or what else it came from), for messages."""
        return self.tokenizer_source or "the HFTokenizer's tokenizer.json"

    @property
    def backend(self):
        """The `tokenizers.Tokenizer` this layer runs (the `tokenizer.json`)."""
        self._check_tokenizer()
        return self._backend

    def _check_tokenizer(self):
        if self._backend is None:
            raise ValueError("This HFTokenizer has no tokenizer.json yet: give `tokenizer=` or load it from a file.")

    @property
    def special_tokens_map(self):
        """The named special tokens that are set, e.g. `{"bos_token": "<s>", "eos_token": "</s>"}`
        (what transformers passes to a chat template)."""
        return {name: getattr(self, name) for name in SPECIAL_TOKEN_NAMES if getattr(self, name) is not None}

    @property
    def special_tokens(self):
        return list(dict.fromkeys(self.special_tokens_map.values()))

    @property
    def special_token_ids(self):
        return [self.token_to_id(token) for token in self.special_tokens]

    bos_token_id = _token_id("bos_token")
    eos_token_id = _token_id("eos_token")
    unk_token_id = _token_id("unk_token")
    sep_token_id = _token_id("sep_token")
    pad_token_id = _token_id("pad_token")
    cls_token_id = _token_id("cls_token")
    mask_token_id = _token_id("mask_token")

    @property
    def start_token_id(self):
        """The id the checkpoint's tokenizer puts before a text when it adds special tokens (its
        BOS), or None."""
        self._check_tokenizer()
        return self._start_token_id

    @property
    def add_start_token(self):
        """Whether the checkpoint puts `start_token_id` before a text it encodes (a causal LM's
        text prompts get it; a rendered chat writes its own)."""
        return self.start_token_id is not None

    @property
    def end_token_id(self):
        """The EOS id, or None."""
        return self.eos_token_id

    def added_tokens(self):
        """The added tokens (special or not), matched whole in text: `{id: token}`."""
        return {token_id: token.content for token_id, token in self.backend.get_added_tokens_decoder().items()}

    def vocabulary_size(self):
        return self.backend.get_vocab_size(with_added_tokens=True)

    def get_vocabulary(self):
        if self._vocabulary is None:
            by_id = self.backend.get_vocab(with_added_tokens=True)
            self._vocabulary = sorted(by_id, key=by_id.get)
        return list(self._vocabulary)

    def id_to_token(self, id):
        token = self.backend.id_to_token(int(id)) if 0 <= int(id) < self.vocabulary_size() else None
        if token is None:
            raise ValueError(f"Id {id} is not in the vocabulary of {self.vocabulary_size()} tokens.")
        return token

    def token_to_id(self, token):
        token_id = self.backend.token_to_id(token)
        if token_id is None:
            raise ValueError(f"Token {token!r} is not in the vocabulary.")
        return token_id

    def tokenize(self, inputs):
        """Ids of a string (int32 array) or of a list of strings (a list of id lists); a
        `tf.py_function` in a graph. No special token is added around the text."""
        self._check_tokenizer()
        if _in_tensorflow_graph():
            return self._tokenize_graph(inputs)
        texts, batched = _strings(inputs)
        ids = self._encode(texts)
        return ids if batched else np.asarray(ids[0], "int32")

    def _encode(self, texts):
        try:
            with _panics_as_errors(self._source, "tokenizing", self.backend):
                encodings = self.backend.encode_batch(texts, add_special_tokens=False)
        except (TypeError, ValueError) as error:
            for index, text in enumerate(texts):
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as bad:
                    raise ValueError(f"Text {index} is not valid Unicode ({bad.reason} at {bad.start}).") from error
            raise
        return [encoding.ids for encoding in encodings]

    def _tokenize_graph(self, inputs):
        import tensorflow as tf

        inputs = tf.convert_to_tensor(inputs, tf.string)
        if inputs.shape.rank not in (0, 1):
            raise ValueError(f"HFTokenizer takes a string or a 1-D string tensor; received shape {inputs.shape}.")

        def encode(texts):
            ids = self._encode([text.decode("utf-8") for text in texts.numpy()])
            return np.concatenate([np.asarray(row, "int32") for row in ids] + [np.zeros([0], "int32")]), [
                len(row) for row in ids
            ]

        values, lengths = tf.py_function(encode, [tf.reshape(inputs, [-1])], [tf.int32, tf.int64])
        values.set_shape([None])
        lengths.set_shape([None])
        ragged = tf.RaggedTensor.from_row_lengths(values, lengths, validate=False)
        return ragged[0] if inputs.shape.rank == 0 else ragged

    def detokenize(self, inputs):
        """The text of a list of ids (a string), or of a batch of them (a list of strings); a
        `tf.py_function` in a graph. Special tokens are kept; a byte sequence cut mid-character
        decodes to U+FFFD."""
        self._check_tokenizer()
        if _in_tensorflow_graph():
            return self._detokenize_graph(inputs)
        rows, batched = _id_rows(inputs)
        texts = self._decode(rows)
        return texts if batched else texts[0]

    def _decode(self, rows):
        size = self.vocabulary_size()
        for row in rows:
            bad = [token for token in row if not 0 <= token < size]
            if bad:
                raise ValueError(f"Ids {bad[:5]} are not in the vocabulary of {size} tokens.")
        with _panics_as_errors(self._source, "decoding", self.backend):
            return self.backend.decode_batch(rows, skip_special_tokens=False)

    def _detokenize_graph(self, inputs):
        import tensorflow as tf

        if isinstance(inputs, tf.RaggedTensor):
            values, lengths, batched = inputs.flat_values, inputs.row_lengths(), True
        else:
            inputs = tf.convert_to_tensor(inputs)
            batched = inputs.shape.rank == 2
            rows = inputs if batched else inputs[tf.newaxis]
            values, lengths = tf.reshape(rows, [-1]), tf.fill([tf.shape(rows)[0]], tf.shape(rows, tf.int64)[1])

        def decode(values, lengths):
            values, splits = values.numpy().tolist(), np.cumsum([0, *lengths.numpy().tolist()])
            # One tensor: a list would be taken for several outputs.
            return tf.constant(self._decode([values[start:end] for start, end in zip(splits[:-1], splits[1:])]))

        texts = tf.py_function(decode, [values, lengths], tf.string)
        texts.set_shape([None])
        return texts if batched else texts[0]

    def call(self, inputs):
        return self.tokenize(inputs)

    def get_build_config(self):
        # Nothing is built from shapes.
        return None

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=False, **kwargs):
        """`messages` rendered with the chat template, as transformers' `apply_chat_template`
        renders them (see `kzoo.tokenizers.chat_template.render_chat_template`).

        Args:
            messages: list of `{"role", "content"}` dicts.
            add_generation_prompt: bool, end with the header of the assistant's reply.
            tokenize: bool, return the ids of the text (no special token added around it, as
                transformers) rather than the text.
            **kwargs: template variables (`tools`, `documents`, `enable_thinking`, ...).
        """
        if not self.chat_template:
            raise ValueError("This tokenizer has no chat template (`chat_template`).")
        text = render_chat_template(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            special_tokens=self.special_tokens_map,
            source=self.chat_template_source,
            **kwargs,
        )
        return self.tokenize(text).tolist() if tokenize else text

    def save_assets(self, dir_path):
        (Path(dir_path) / TOKENIZER_FILE).write_text(self.backend.to_str(), encoding="utf-8")

    def load_assets(self, dir_path):
        # `dir_path` is where Keras unpacked the assets, a temporary folder: not worth naming.
        self.tokenizer_source = self.tokenizer_source or f"the {TOKENIZER_FILE} of the .keras file"
        self.set_tokenizer(Path(dir_path) / TOKENIZER_FILE)

    def get_config(self):
        config = super().get_config()
        config.update(self.special_tokens_map)
        config["chat_template"] = self.chat_template
        return config


def is_tokenizers_panic(error):
    """Whether `error` is a panic of the `tokenizers` package (its Rust code gave up): pyo3's
    `PanicException`, a `BaseException` that `except Exception` lets through, of the module
    `pyo3_runtime`, which cannot be imported to name the class."""
    return any(cls.__name__ == "PanicException" and cls.__module__ == "pyo3_runtime" for cls in type(error).__mro__)


@contextlib.contextmanager
def _panics_as_errors(source, doing, backend=None):
    """A panic of the `tokenizers` package inside, raised as a `ValueError` naming `source` (the
    tokenizer's file), what it was `doing`, and the regex patterns of `backend`'s pipeline: their
    usual cause is a pattern that backtracks past the regex engine's limit on a text (Oniguruma's
    "retry-limit-in-match over", from a nested repeat such as `(a+)+$`)."""
    try:
        yield
    except BaseException as error:
        if not is_tokenizers_panic(error):
            raise
        listed = ", ".join(f"{pattern!r:.200}" for pattern in (_regex_patterns(backend) if backend else []))
        if listed and "retry-limit" in str(error):
            listed = f"; its regex patterns, of which one backtracks too much on this text: {listed}"
        elif listed:
            listed = f"; its regex patterns: {listed}"
        raise ValueError(f"{source}: the `tokenizers` package failed while {doing} ({error}){listed}.") from error


def _regex_patterns(backend):
    """The regex patterns of a `tokenizers.Tokenizer`'s pipeline (normalizers, pre-tokenizers,
    decoders: every `{"Regex": pattern}` of its `tokenizer.json`)."""
    patterns = []

    def walk(value):
        if isinstance(value, dict):
            if isinstance(value.get("Regex"), str):
                patterns.append(value["Regex"])
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    data = json.loads(backend.to_str())
    walk({key: data.get(key) for key in ("normalizer", "pre_tokenizer", "decoder")})
    return list(dict.fromkeys(patterns))


def _warn_of_missing_byte_tokens(backend, source):
    """Warns when a byte-fallback BPE lacks some of its byte tokens: `tokenizers` spells a
    character outside the vocabulary as its UTF-8 bytes `<0xNN>`, and where one is missing it
    takes the unknown token instead, or without one drops the character silently."""
    model = backend.model
    if not getattr(model, "byte_fallback", False):
        return
    vocabulary = backend.get_vocab(with_added_tokens=False)
    missing = [f"<0x{byte:02X}>" for byte in range(256) if f"<0x{byte:02X}>" not in vocabulary]
    if missing:
        unknown = getattr(model, "unk_token", None)
        outcome = f"become its unknown token {unknown!r}" if unknown else "are dropped from the ids"
        warnings.warn(
            f"{source}: characters outside the vocabulary are spelled as byte tokens (byte fallback), but the "
            f"vocabulary lacks {len(missing)} of the 256 ({', '.join(missing[:4])}"
            f"{', ...' if len(missing) > 4 else ''}): characters that need them {outcome}.",
            stacklevel=4,  # where the tokenizer is made
        )


def _in_tensorflow_graph():
    """Whether TensorFlow is tracing a graph (a `tf.function`, a `tf.data` map)."""
    tf = imported_tensorflow()
    return tf is not None and not tf.executing_eagerly()


def _is_tensorflow_tensor(x, ragged=False):
    """Whether `x` is a TensorFlow tensor (a `tf.RaggedTensor` with `ragged`)."""
    tf = imported_tensorflow()
    return tf is not None and isinstance(x, tf.RaggedTensor if ragged else tf.Tensor)


def _strings(inputs):
    """`(texts, batched)`: a list of Python strings from a string, a list of them, or a string
    array or tensor (of rank 0 or 1)."""
    if _is_tensorflow_tensor(inputs) or isinstance(inputs, np.ndarray):
        array = np.asarray(inputs.numpy() if _is_tensorflow_tensor(inputs) else inputs)
        if array.ndim > 1 or (array.size and array.dtype.kind not in "USO"):
            raise ValueError(
                f"HFTokenizer takes strings: a string or a 1-D array of them; received {array.dtype} {array.shape}."
            )
        batched, inputs = array.ndim == 1, array.tolist()
    else:
        batched = isinstance(inputs, (list, tuple))
    texts = list(inputs) if batched else [inputs]
    for index, text in enumerate(texts):
        if isinstance(text, bytes):
            texts[index] = text.decode("utf-8")
        elif not isinstance(text, str):
            where = f"item {index} is" if batched else "received"
            raise ValueError(f"HFTokenizer takes strings; {where} a {type(text).__name__} ({text!r:.40}).")
    return texts, batched


def _id_rows(inputs):
    """`(rows, batched)`: lists of Python ints from ids `(T,)` or `(B, T)`: a list, array or tensor."""
    if _is_tensorflow_tensor(inputs, ragged=True):
        return inputs.to_list(), True
    tensor = keras.ops.is_tensor(inputs) or _is_tensorflow_tensor(inputs)
    if tensor or isinstance(inputs, (np.ndarray, np.generic, int)):
        array = np.asarray(inputs)
        if array.ndim > 2 or (array.size and array.dtype.kind not in "iu"):
            raise ValueError(
                f"HFTokenizer detokenizes integer ids (T,) or (B, T); received {array.dtype} {array.shape}."
            )
        if array.ndim == 2:
            return array.tolist(), True
        return [array.reshape([-1]).tolist()], False
    batched = bool(inputs) and not isinstance(inputs[0], (int, np.integer))
    rows = [list(map(int, row)) for row in inputs] if batched else [list(map(int, inputs))]
    return rows, batched
