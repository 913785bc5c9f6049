"""A keras-hub tokenizer as a Hugging Face `tokenizer.json`, for runtimes that read that format.

LiteRT-LM (and any `tokenizers`-based runtime) tokenizes with the Hugging Face `tokenizers`
library. `hugging_face_tokenizer(tokenizer)` builds the equivalent `tokenizers.Tokenizer`, with
one writer per kind of keras-hub tokenizer (`WRITERS`, keyed by class), together with the ids
a generating runtime needs: the start token it prepends (None for none) and the stop tokens.
The result tokenizes every string to the ids the keras-hub tokenizer gives and decodes ids to
its text; `kzoo.export` checks both in the runtime before it writes a bundle.

Kinds so far:

- `kzoo.data.CharacterTokenizer`: `WordLevel` over the characters `chr(0) .. chr(V - 1)`, each
  character a word, characters outside the vocabulary its `unknown_id` (26); no start token,
  stop token 0 (NUL, never in text).
- keras-hub's `UnicodeCodepointTokenizer` (kzoo's character tokenizer before): the same, with
  unknown = `V - 1`, as keras-hub clamps code points to the last id.

WordPiece and GPT-2 byte-level BPE writers join `WRITERS` as task models carry those
tokenizers.

Example:
>>> exported = hugging_face_tokenizer(kzoo.data.character_tokenizer(128))
>>> exported.tokenizer.encode("Hi").ids
[72, 105]
>>> exported.tokenizer.to_str()  # the tokenizer.json text
"""

import dataclasses

import keras_hub
import tokenizers
from tokenizers import decoders
from tokenizers import models
from tokenizers import pre_tokenizers

from kzoo.data.characters import END_ID
from kzoo.data.characters import CharacterTokenizer


@dataclasses.dataclass
class HuggingFaceTokenizer:
    """A keras-hub tokenizer in Hugging Face form.

    Attributes:
        tokenizer: the `tokenizers.Tokenizer`; `to_str()` is the `tokenizer.json` text.
        start_token_id: the id a runtime puts before every prompt, or None.
        stop_token_ids: the ids that end a generation (LiteRT-LM needs at least one).
    """

    tokenizer: tokenizers.Tokenizer
    start_token_id: object
    stop_token_ids: list


def hugging_face_tokenizer(tokenizer):
    """The Hugging Face equivalent of a keras-hub `tokenizer` (see `WRITERS`).

    Raises:
        ValueError: for a tokenizer kind, or option, with no writer.
    """
    for cls in type(tokenizer).__mro__:
        if cls in WRITERS:
            return WRITERS[cls](tokenizer)
    kinds = ", ".join(cls.__name__ for cls in WRITERS)
    raise ValueError(f"No tokenizer.json writer for a {type(tokenizer).__name__}; kzoo writes {kinds}.")


def _characters(tokenizer):
    """`WordLevel` over the code points: each character is one word, characters outside the
    vocabulary become the tokenizer's id for them, and ids decode back to characters, joined."""
    options = {
        "lowercase": tokenizer.lowercase,
        "normalization_form": tokenizer.normalization_form,
        "sequence_length": tokenizer.sequence_length,
    }
    if any(options.values()):
        set_options = {name: value for name, value in options.items() if value}
        raise ValueError(f"Cannot write a tokenizer.json for a character tokenizer with {set_options}.")
    size = tokenizer.vocabulary_size()
    unknown_id = tokenizer.unknown_id if isinstance(tokenizer, CharacterTokenizer) else size - 1
    result = tokenizers.Tokenizer(
        models.WordLevel({chr(i): i for i in range(size)}, unk_token=chr(unknown_id))
    )
    # `[\s\S]`, not `.`: the regex engine's `.` skips line breaks.
    result.pre_tokenizer = pre_tokenizers.Split(tokenizers.Regex(r"[\s\S]"), behavior="isolated")
    # keras-hub drops id 0 (padding) when detokenizing; Fuse joins the characters without spaces.
    result.decoder = decoders.Sequence([decoders.Replace("\x00", ""), decoders.Fuse()])
    return HuggingFaceTokenizer(result, start_token_id=None, stop_token_ids=[END_ID])


# keras-hub tokenizer class -> writer; the most derived class of a tokenizer that is a key wins.
WRITERS = {
    CharacterTokenizer: _characters,
    keras_hub.tokenizers.UnicodeCodepointTokenizer: _characters,
}
