"""The byte-pair tokenizers of the Llama lineage as `tokenizers` pipelines, built from a vocabulary
and its merges as transformers builds them.

A `tokenizer.json` holds the whole pipeline. A SentencePiece `tokenizer.model` and a GGUF file hold
only the vocabulary (and scores or merges); transformers rebuilds the rest from the tokenizer class
of the model (`LlamaTokenizer`, `GemmaTokenizer`, `GPT2Tokenizer`). These functions build the same
pipelines, so a tokenizer read from those files gives transformers' ids:

- `sentencepiece_llama`: BPE with byte fallback, spaces as "▁" and a "▁" before the text
  (`Metaspace`), as `LlamaTokenizer` (Llama 2, Mistral).
- `sentencepiece_gemma`: BPE with byte fallback, spaces as "▁", no prefix, as `GemmaTokenizer`.
- `byte_level`: byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM), behind the given pre-tokenizer.

`merges_by_rank` recovers the merges of a SentencePiece vocabulary; `add_tokens` and
`set_post_processor` add the special tokens and the BOS (or EOS) around the text.
"""

import tokenizers
from tokenizers import decoders
from tokenizers import models
from tokenizers import normalizers
from tokenizers import pre_tokenizers
from tokenizers import processors

# SentencePiece's stand-in for a space.
SPACE = "\u2581"


def merges_by_rank(vocabulary, ranks, descending=False):
    """The BPE merges a SentencePiece vocabulary implies: every split of a token into two tokens,
    ordered by the token's rank (its id, or its score), as transformers derives them.

    SentencePiece merges, at each step, the adjacent pair whose concatenation is the best-ranked
    token. A `tokenizers` BPE merges by the rank of the pair: listing each token's splits at the
    token's rank does the same, up to ties between equally ranked tokens (transformers' order).

    Args:
        vocabulary: dict token -> id, in the order of the file.
        ranks: dict token -> rank (an id or a score).
        descending: bool, best rank first is the highest (scores) rather than the lowest (ids).

    Returns:
        A list of `(left, right)` pairs, best first.
    """
    candidates = []
    for token in vocabulary:
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocabulary and right in vocabulary:
                candidates.append((ranks[token], cut, len(token) - cut, left, right))
    # Ties (equal rank and lengths) keep the vocabulary's order: Python's sort is stable.
    candidates.sort(key=lambda candidate: candidate[:3], reverse=descending)
    return [(left, right) for *_, left, right in candidates]


def byte_alphabet():
    """GPT-2's character for each byte 0..255 (`ByteLevel`'s): the byte's own Latin-1 character
    where it is printable, else the next code point from 256 on."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    others = iter(range(256, 512))
    return [chr(byte) if byte in printable else chr(next(others)) for byte in range(256)]


def sentencepiece_llama(vocabulary, merges, add_prefix_space=True, legacy=False):
    """`LlamaTokenizer`'s pipeline: spaces as "▁" and a "▁" before the text (before its first
    piece only unless `legacy`; none without `add_prefix_space`), BPE with byte fallback."""
    tokenizer = tokenizers.Tokenizer(
        models.BPE(vocab=vocabulary, merges=merges, fuse_unk=True, byte_fallback=True, dropout=None)
    )
    prepend = ("always" if legacy else "first") if add_prefix_space else "never"
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme=prepend, split=False)
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix_space:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    tokenizer.decoder = decoders.Sequence(steps)
    return tokenizer


def sentencepiece_gemma(vocabulary, merges, unk_token):
    """`GemmaTokenizer`'s pipeline: spaces as "▁", no prefix, BPE with byte fallback."""
    tokenizer = tokenizers.Tokenizer(
        models.BPE(
            vocab=vocabulary, merges=merges, unk_token=unk_token, fuse_unk=True, byte_fallback=True, dropout=None
        )
    )
    tokenizer.normalizer = normalizers.Replace(" ", SPACE)
    tokenizer.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    return tokenizer


def byte_level(vocabulary, merges, pre_tokenizer=None):
    """Byte-level BPE (`GPT2Tokenizer`'s pipeline): the text's UTF-8 bytes as characters, split
    by `pre_tokenizer` (GPT-2's `ByteLevel` split when None), then merged."""
    tokenizer = tokenizers.Tokenizer(
        models.BPE(
            vocab=vocabulary,
            merges=merges,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            dropout=None,
        )
    )
    tokenizer.pre_tokenizer = pre_tokenizer or pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def add_tokens(tokenizer, added=(), named=()):
    """Adds the tokens matched whole in text, as transformers does.

    Args:
        tokenizer: a `tokenizers.Tokenizer`, changed in place.
        added: `(token, special)` pairs: a vocabulary's control (special) and user-defined (not
            special) tokens.
        named: the named special tokens (BOS, EOS, ...): added as special tokens where not
            already added (and appended to the vocabulary where absent, as transformers does).
    """
    tokenizer.add_special_tokens(
        [tokenizers.AddedToken(token, special=True, normalized=False) for token, special in added if special]
    )
    tokenizer.add_tokens(
        [tokenizers.AddedToken(token, special=False, normalized=False) for token, special in added if not special]
    )
    present = {token.content for token in tokenizer.get_added_tokens_decoder().values()}
    missing = dict.fromkeys(token for token in named if token is not None and token not in present)
    tokenizer.add_special_tokens([tokenizers.AddedToken(token, special=True, normalized=False) for token in missing])


def set_post_processor(tokenizer, bos_token=None, eos_token=None, add_bos=False, add_eos=False):
    """What `encode(..., add_special_tokens=True)` puts around the text: BOS before it with
    `add_bos`, EOS after it with `add_eos` (a token that is None is not added), as transformers'
    `update_post_processor` sets it."""
    add_bos, add_eos = add_bos and bos_token is not None, add_eos and eos_token is not None
    single = " ".join([f"{bos_token}:0"] * add_bos + ["$A:0"] + [f"{eos_token}:0"] * add_eos)
    pair = " ".join([single] + [f"{bos_token}:1"] * add_bos + ["$B:1"] + [f"{eos_token}:1"] * add_eos)
    ends = [(token, tokenizer.token_to_id(token)) for token, on in ((bos_token, add_bos), (eos_token, add_eos)) if on]
    tokenizer.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=ends)
