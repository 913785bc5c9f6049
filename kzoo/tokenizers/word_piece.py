"""keras-hub tokenizers for kzoo, their reserved tokens, and saving them next to a model.

Two kinds:

- `character_tokenizer`: `kzoo.tokenizers.CharacterTokenizer`, id = Unicode code point below
  `vocabulary_size`, and id 26 (ASCII SUB) for every character outside. Chosen over a fitted
  character vocabulary because it has nothing to fit or save, never drops whitespace (a
  WordPiece tokenizer splits on it) and detokenizes exactly; Tiny Shakespeare is pure ASCII, so
  `vocabulary_size=128` covers it and costs 63 unused embedding rows over its 65 characters. It
  reserves no special tokens: id 0 (NUL, which never occurs in text) serves as padding.
- `word_piece_tokenizer`: `keras_hub.tokenizers.WordPieceTokenizer` over a vocabulary fitted
  on a training split with `train_word_piece_vocabulary`. The vocabulary starts with
  `SPECIAL_TOKENS`, so their ids are fixed:

  | id | token | used by |
  |---|---|---|
  | 0 | `[PAD]` | padding in every pipeline (`PAD_ID`) |
  | 1 | `[UNK]` | words with a character outside the vocabulary (the tokenizer's `oov_token`) |
  | 2 | `[CLS]` | start of classification, tagging and masked-LM inputs (`CLS_ID`) |
  | 3 | `[SEP]` | end of those inputs (`SEP_ID`) |
  | 4 | `[MASK]` | masked-LM masking (`MASK_ID`) |
  | 5 | `[BOS]` | start of a seq2seq decoder input (`BOS_ID`) |
  | 6 | `[EOS]` | end of a seq2seq target (`EOS_ID`) |

`save_tokenizer` writes `tokenizer.json` (the keras config) and, for WordPiece, `vocabulary.txt`
(one token per line, id = line number - 1) into a model's folder; `load_tokenizer` reads them.
"""

import json
from pathlib import Path

import keras
import keras_hub
import tensorflow as tf

from kzoo import files
from kzoo.tokenizers.characters import CharacterTokenizer

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[BOS]", "[EOS]")
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID, BOS_ID, EOS_ID = range(len(SPECIAL_TOKENS))

_CONFIG_FILE = "tokenizer.json"


def character_tokenizer(vocabulary_size=128):
    """A character tokenizer: each Unicode code point below `vocabulary_size` is its id.

    Case is kept. Characters at or above `vocabulary_size` all become id 26 (ASCII SUB, the
    substitute character; see `kzoo.tokenizers.CharacterTokenizer`).

    Args:
        vocabulary_size: int; 128 covers ASCII, 256 Latin-1.

    Example:
    >>> tokenizer = character_tokenizer()
    >>> tokenizer("Hi!\\n").tolist()
    [72, 105, 33, 10]
    >>> tokenizer.detokenize([72, 105])
    'Hi'
    """
    return CharacterTokenizer(vocabulary_size)


def train_word_piece_vocabulary(texts, vocabulary_size, lowercase=False):
    """A WordPiece vocabulary fitted on `texts`, starting with `SPECIAL_TOKENS` (ids 0-6).

    Fit it on the training split only, so validation and test stay unseen.

    Args:
        texts: a `tf.data.Dataset` of strings (or of string batches), or a list of strings.
        vocabulary_size: int, the size of the vocabulary including the special tokens; the
            result can be smaller when the texts hold fewer distinct pieces.
        lowercase: bool, whether to fit (and later tokenize) lower-cased text.

    Returns:
        A list of tokens; continuation pieces start with "##".

    Example:
    >>> vocabulary = train_word_piece_vocabulary(["the cat sat", "the hat"], 40)
    >>> vocabulary[:7] == list(SPECIAL_TOKENS)
    True
    """
    if not isinstance(texts, tf.data.Dataset):
        texts = tf.data.Dataset.from_tensor_slices(list(texts))
    if texts.element_spec.shape.rank == 0:
        # Counting words batch by batch is much faster than string by string.
        texts = texts.batch(1024)
    return keras_hub.tokenizers.compute_word_piece_vocabulary(
        texts, vocabulary_size, lowercase=lowercase, reserved_tokens=list(SPECIAL_TOKENS)
    )


def word_piece_tokenizer(vocabulary, lowercase=False):
    """A WordPiece tokenizer over `vocabulary`, which must start with `SPECIAL_TOKENS`.

    The special tokens written in a text are kept whole: `"hello [SEP]"` gives the id of
    "hello", then `SEP_ID`, as Hugging Face's `tokenizers` (and so a LiteRT-LM bundle's
    tokenizer) gives it, so that a prompt can be written as text.

    Args:
        vocabulary: a list of tokens (from `train_word_piece_vocabulary`) or the path of a
            vocabulary file, one token per line.
        lowercase: bool; must match the setting the vocabulary was fitted with.

    Example:
    >>> tokenizer = word_piece_tokenizer(train_word_piece_vocabulary(["the cat sat"], 30))
    >>> tokenizer.detokenize(tokenizer("the cat"))
    'the cat'
    """
    tokenizer = keras_hub.tokenizers.WordPieceTokenizer(
        vocabulary=vocabulary, lowercase=lowercase, special_tokens=list(SPECIAL_TOKENS), special_tokens_in_strings=True
    )
    reserved = tokenizer.get_vocabulary()[: len(SPECIAL_TOKENS)]
    if reserved != list(SPECIAL_TOKENS):
        raise ValueError(
            f"The vocabulary must start with kzoo's special tokens {list(SPECIAL_TOKENS)}; it starts with {reserved}."
        )
    return tokenizer


def save_tokenizer(tokenizer, directory):
    """Writes `tokenizer.json` (the keras config) and the tokenizer's assets (WordPiece: `vocabulary.txt`).

    Args:
        tokenizer: a keras-hub tokenizer, e.g. from `character_tokenizer` or `word_piece_tokenizer`.
        directory: the folder, typically the model's; created if missing.

    Example:
    >>> save_tokenizer(word_piece_tokenizer(train_word_piece_vocabulary(["the cat sat"], 30)), "runs/tiny")
    >>> sorted(path.name for path in Path("runs/tiny").iterdir())
    ['tokenizer.json', 'vocabulary.txt']
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = keras.saving.serialize_keras_object(tokenizer)
    files.write_text(directory / _CONFIG_FILE, json.dumps(config, indent=2))
    if tokenizer.file_assets:
        tokenizer.save_assets(str(directory))


def load_tokenizer(directory):
    """The tokenizer `save_tokenizer` wrote into `directory`.

    Args:
        directory: the folder holding `tokenizer.json` (and `vocabulary.txt` for WordPiece).

    Example:
    >>> save_tokenizer(character_tokenizer(), "runs/characters")
    >>> load_tokenizer("runs/characters")("Hi").tolist()
    [72, 105]
    """
    path = Path(directory) / _CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"No {_CONFIG_FILE} in {directory}; save it with kzoo.tokenizers.save_tokenizer.")
    tokenizer = keras.saving.deserialize_keras_object(json.loads(path.read_text(encoding="utf-8")))
    if tokenizer.file_assets:
        tokenizer.load_assets(str(directory))
    return tokenizer
