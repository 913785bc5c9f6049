"""`BertTokenizer`: BERT's WordPiece with the ids of Hugging Face's `tokenizers` package.

keras-hub's BERT tokenizer behind the normalization `tokenizers`' `BertNormalizer` applies and
the split of its `BertPreTokenizer`, so a BERT checkpoint's text gives the ids it was trained
with. `kzoo.checkpoints.hf.tokenizer_files.read_bert_tokenizer` reads one from a folder.
Importing this module imports keras-hub and tensorflow-text.
"""

import re

import keras
import keras_hub
import tensorflow as tf
import tensorflow_text as tf_text

from kzoo import _compat

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
