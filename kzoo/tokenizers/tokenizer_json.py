"""A keras-hub tokenizer as a Hugging Face `tokenizer.json`, for runtimes that read that format.

LiteRT-LM (and any `tokenizers`-based runtime) tokenizes with the Hugging Face `tokenizers`
library. `hugging_face_tokenizer(tokenizer)` builds the equivalent `tokenizers.Tokenizer`, with
one writer per kind of keras-hub tokenizer (`WRITERS`, keyed by class), together with the ids
a generating runtime needs: the start token it prepends (None for none) and the stop tokens,
both read from the tokenizer itself. The result tokenizes every string to the ids the keras-hub
tokenizer gives and decodes ids to its text; `kzoo.export` checks both in the runtime before it
writes a bundle.

Kinds:

- `kzoo.tokenizers.CharacterTokenizer`: `WordLevel` over the characters `chr(0) .. chr(V - 1)`, each
  character a word, characters outside the vocabulary its `unknown_id` (26); no start token,
  stop token its `end_token_id` (0, NUL, never in text).
- keras-hub's `UnicodeCodepointTokenizer` (kzoo's character tokenizer before): the same, with
  unknown = `V - 1`, as keras-hub clamps code points to the last id, and stop token 0.
- WordPiece: keras-hub's `WordPieceTokenizer` (the vocabularies kzoo's recipes fit,
  `kzoo.tokenizers.word_piece_tokenizer`) and kzoo's `BertTokenizer` (BERT checkpoints). A word
  that WordPiece cannot spell from the vocabulary, a character outside it say, becomes the
  tokenizer's `oov_token` ("[UNK]"), as in Keras; so does a word longer than the limit.
  Special tokens written in the text ("[SEP]") are kept whole where the Keras tokenizer
  keeps them (kzoo's `BertTokenizer`, and `special_tokens_in_strings=True`, which
  `kzoo.tokenizers.word_piece_tokenizer` sets), and spelled out otherwise. No start token; the stop
  token is the tokenizer's `end_token_id` where it has one ([SEP] for BERT), else kzoo's
  end token "[EOS]" (`conditional_lm_batches` ends each sequence with it), looked up in the
  vocabulary.
  Known differences from keras-hub's `WordPieceTokenizer`, on text rarely seen: it limits a
  word to 100 UTF-8 bytes, the `tokenizers` library to 100 characters; with
  `lowercase=True` it case-folds each word (Unicode NFKC_Casefold), which the written
  tokenizer approximates by NFKC, lowercasing and the foldings of "ß" and final "ς", before
  splitting (so a character whose NFKC form holds a space or punctuation, such as U+00A0,
  is split where keras-hub keeps it in the word). kzoo's `BertTokenizer` has neither
  difference: it follows `tokenizers`' `BertNormalizer` exactly.
- GPT-2 byte-level BPE: keras-hub's `BytePairTokenizer` and `GPT2Tokenizer` (GPT-2
  checkpoints): GPT-2's split of the text, its bytes mapped to characters, then the merges.
  Nothing is outside the vocabulary: any character, an emoji say, is its UTF-8 bytes, each of
  which has a token (a vocabulary that lacks one is refused). Its `unsplittable_tokens`
  ("<|endoftext|>") are kept whole. Start token: the tokenizer's `start_token_id` (GPT-2:
  "<|endoftext|>", the document separator it was trained with) or none; stop token: its
  `end_token_id`.
- `kzoo.tokenizers.HFTokenizer` (the Llama lineage: Llama, Qwen, SmolLM, Gemma): its own
  `tokenizer.json`, less the post-processor (the runtime puts the start token before a prompt
  itself, from the metadata). Start token: its `start_token_id` (the checkpoint's BOS, or none);
  stop tokens: its EOS and its chat template's end-of-turn token (`<|im_end|>` for ChatML,
  `<end_of_turn>` for Gemma, `<|eot_id|>` for Llama 3); the chat template comes along.

Example:
>>> exported = hugging_face_tokenizer(kzoo.tokenizers.character_tokenizer(128))
>>> exported.tokenizer.encode("Hi").ids
[72, 105]
>>> exported.tokenizer.to_str()[:40]  # the tokenizer.json text
'{"version":"1.0","truncation":null,"padd'
"""

import dataclasses

import keras_hub
import tokenizers
from tokenizers import decoders
from tokenizers import models
from tokenizers import normalizers
from tokenizers import pre_tokenizers

from kzoo import _compat
from kzoo.tokenizers import chat_template
from kzoo.tokenizers.bert import BertTokenizer
from kzoo.tokenizers.characters import CharacterTokenizer
from kzoo.tokenizers.hugging_face import HFTokenizer

# kzoo's end-of-sequence token in the WordPiece vocabularies it fits (`kzoo.tokenizers.SPECIAL_TOKENS`).
WORD_PIECE_END_TOKEN = "[EOS]"


@dataclasses.dataclass
class HuggingFaceTokenizer:
    """A keras-hub tokenizer in Hugging Face form.

    Attributes:
        tokenizer: the `tokenizers.Tokenizer`; `to_str()` is the `tokenizer.json` text.
        start_token_id: the id a runtime puts before every prompt, or None.
        stop_token_ids: the ids that end a generation (LiteRT-LM needs at least one).
        chat_template: the Jinja chat template, or None.
    """

    tokenizer: tokenizers.Tokenizer
    start_token_id: object
    stop_token_ids: list
    chat_template: object = None


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


def _refuse_options(tokenizer, kind, **options):
    set_options = {name: value for name, value in options.items() if value}
    if set_options:
        raise ValueError(f"Cannot write a tokenizer.json for a {kind} tokenizer with {set_options}.")


def _characters(tokenizer):
    """`WordLevel` over the code points: each character is one word, characters outside the
    vocabulary become the tokenizer's id for them, and ids decode back to characters, joined."""
    _refuse_options(
        tokenizer,
        "character",
        lowercase=tokenizer.lowercase,
        normalization_form=tokenizer.normalization_form,
        sequence_length=tokenizer.sequence_length,
    )
    size = tokenizer.vocabulary_size()
    unknown_id = tokenizer.unknown_id if isinstance(tokenizer, CharacterTokenizer) else size - 1
    result = tokenizers.Tokenizer(models.WordLevel({chr(i): i for i in range(size)}, unk_token=chr(unknown_id)))
    # `[\s\S]`, not `.`: the regex engine's `.` skips line breaks.
    result.pre_tokenizer = pre_tokenizers.Split(tokenizers.Regex(r"[\s\S]"), behavior="isolated")
    # keras-hub drops id 0 (padding) when detokenizing; Fuse joins the characters without spaces.
    result.decoder = decoders.Sequence([decoders.Replace("\x00", ""), decoders.Fuse()])
    # NUL, padding, which keras-hub's clamping tokenizer never gives a character either.
    end_token_id = getattr(tokenizer, "end_token_id", 0)
    return HuggingFaceTokenizer(result, start_token_id=None, stop_token_ids=[end_token_id])


# keras-hub's WordPiece pre-tokenization (`keras_hub.src.tokenizers.word_piece_tokenizer`), in
# the `tokenizers` regex dialect: words end at ASCII spaces and at control and format
# characters, which are dropped; punctuation (every ASCII non-alphanumeric, and Unicode P) and,
# with `split_on_cjk`, CJK ideographs are words of their own.
_WORD_PIECE_SPACE = r"[\t\n\x0B\f\r ]|\p{Cc}|\p{Cf}"
_WORD_PIECE_PUNCTUATION = r"[!-/]|[:-@]|[\[-`]|[{-~]|\p{P}"
_CJK = "|".join(
    f"[{chr(first)}-{chr(last)}]"
    for first, last in (
        (0x4E00, 0x9FFF),
        (0x3400, 0x4DBF),
        (0x20000, 0x2A6DF),
        (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F),
        (0x2B820, 0x2CEAF),
        (0xF900, 0xFAFF),
        (0x2F800, 0x2FA1F),
    )
)


def _word_pieces(tokenizer):
    """WordPiece over the tokenizer's vocabulary, behind its normalization and word split:
    `tokenizers`' own BERT normalizer and pre-tokenizer for kzoo's `BertTokenizer` (which
    follows them), keras-hub's rules written out for its `WordPieceTokenizer`."""
    _refuse_options(tokenizer, "WordPiece", sequence_length=tokenizer.sequence_length, split=not tokenizer.split)
    vocabulary = tokenizer.get_vocabulary()
    bert = isinstance(tokenizer, BertTokenizer)
    result = tokenizers.Tokenizer(
        models.WordPiece(
            {token: i for i, token in enumerate(vocabulary)},
            unk_token=tokenizer.oov_token,
            continuing_subword_prefix=tokenizer.suffix_indicator,
            max_input_chars_per_word=tokenizer.max_word_length if bert else 100,
        )
    )
    if bert:
        result.normalizer = normalizers.BertNormalizer(
            clean_text=True,
            handle_chinese_chars=tokenizer.split_on_cjk,
            strip_accents=bool(tokenizer.strip_accents),
            lowercase=bool(tokenizer.lowercase),
        )
        result.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        special_tokens = tokenizer.special_tokens
    else:
        steps = []
        if tokenizer.strip_accents:
            steps += [normalizers.NFD(), normalizers.Replace(tokenizers.Regex(r"\p{Mn}"), "")]
        if tokenizer.lowercase:
            steps += [
                normalizers.NFKC(),
                normalizers.Lowercase(),
                normalizers.Replace("ß", "ss"),
                normalizers.Replace("ς", "σ"),
            ]
        if steps:
            result.normalizer = normalizers.Sequence(steps)
        kept = _WORD_PIECE_PUNCTUATION + (f"|{_CJK}" if tokenizer.split_on_cjk else "")
        result.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(tokenizers.Regex(_WORD_PIECE_SPACE), behavior="removed"),
                pre_tokenizers.Split(tokenizers.Regex(kept), behavior="isolated"),
            ]
        )
        special_tokens = _compat.word_piece_special_tokens(tokenizer) or []
    # Matched in the raw text before anything else, as Keras matches them.
    result.add_special_tokens(
        [tokenizers.AddedToken(token, special=True, normalized=False) for token in special_tokens]
    )
    # keras-hub joins words with spaces and glues continuation pieces on, nothing more
    # (`cleanup` would also remove the space before punctuation).
    result.decoder = decoders.WordPiece(prefix=tokenizer.suffix_indicator, cleanup=False)
    end_token_id = getattr(tokenizer, "end_token_id", None)
    if end_token_id is None:
        if WORD_PIECE_END_TOKEN not in vocabulary:
            raise ValueError(
                f"A WordPiece tokenizer needs an end token for a LiteRT-LM bundle's stop token: it has no "
                f"`end_token_id` and {WORD_PIECE_END_TOKEN!r} is not in its vocabulary."
            )
        end_token_id = vocabulary.index(WORD_PIECE_END_TOKEN)
    return HuggingFaceTokenizer(result, start_token_id=None, stop_token_ids=[int(end_token_id)])


def _byte_pairs(tokenizer):
    """GPT-2's byte-level BPE: its split (the `ByteLevel` regex), bytes as characters, the merges."""
    _refuse_options(tokenizer, "byte-pair", sequence_length=tokenizer.sequence_length)
    vocabulary = tokenizer.get_vocabulary()
    ids = {token: i for i, token in enumerate(vocabulary)}
    missing = [symbol for symbol in pre_tokenizers.ByteLevel.alphabet() if symbol not in ids]
    if missing:
        raise ValueError(
            f"A byte-level BPE vocabulary must hold a token for each of the 256 bytes; it lacks {sorted(missing)}."
        )
    merges = [tuple(merge.split(" ")) for merge in tokenizer.merges if not merge.lstrip().startswith("#version:")]
    result = tokenizers.Tokenizer(models.BPE(vocab=ids, merges=merges))
    result.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=tokenizer.add_prefix_space, use_regex=True)
    result.decoder = decoders.ByteLevel()
    result.add_special_tokens(
        [tokenizers.AddedToken(token, special=True, normalized=False) for token in tokenizer.unsplittable_tokens or []]
    )
    end_token_id = getattr(tokenizer, "end_token_id", None)
    if end_token_id is None:
        raise ValueError(
            "A byte-pair tokenizer needs an end token (`end_token_id`, GPT-2's <|endoftext|>) for a LiteRT-LM "
            "bundle's stop token."
        )
    return HuggingFaceTokenizer(
        result, start_token_id=getattr(tokenizer, "start_token_id", None), stop_token_ids=[int(end_token_id)]
    )


def _hugging_face(tokenizer):
    """An HFTokenizer's own tokenizer.json, without its post-processor: the runtime puts the start
    token before a prompt, and `encode` gives the ids of the text alone, as `tokenize` does."""
    result = tokenizers.Tokenizer.from_str(tokenizer.backend.to_str())
    result.post_processor = None
    stop_token_ids = chat_template.stop_token_ids(tokenizer)
    if not stop_token_ids:
        raise ValueError(
            "An HFTokenizer needs an EOS token (`eos_token`) or a chat template that ends replies with an added "
            "token, for a LiteRT-LM bundle's stop token."
        )
    return HuggingFaceTokenizer(
        result,
        start_token_id=tokenizer.start_token_id,
        stop_token_ids=stop_token_ids,
        chat_template=tokenizer.chat_template,
    )


# keras-hub tokenizer class -> writer; the most derived class of a tokenizer that is a key wins.
WRITERS = {
    CharacterTokenizer: _characters,
    keras_hub.tokenizers.UnicodeCodepointTokenizer: _characters,
    keras_hub.tokenizers.WordPieceTokenizer: _word_pieces,
    keras_hub.tokenizers.BytePairTokenizer: _byte_pairs,
    HFTokenizer: _hugging_face,
}
