"""A GGUF file's tokenizer (its `tokenizer.*` metadata) as an `HFTokenizer`, and an `HFTokenizer` as
that metadata.

A GGUF file has no `tokenizer.json`: it stores the vocabulary, the merges or scores, the token
types, the special ids and the chat template under llama.cpp's keys. `tokenizer_from_gguf(fields)`
builds the tokenizer transformers builds from them (`AutoTokenizer.from_pretrained(folder,
gguf_file=...)`, see `kzoo.tokenizers.byte_pair`), so its ids are transformers':

- `tokenizer.ggml.model` "gpt2": byte-level BPE with the file's merges, split as
  `tokenizer.ggml.pre` says: "gpt-2" / "default" (GPT-2's split), Llama 3's regex ("llama-bpe"
  and its aliases), Qwen2's ("qwen2" and its aliases), and "smollm": digits one by one, then
  GPT-2's split, as SmolLM2's own `tokenizer.json` and llama.cpp split. (transformers 5 does not
  know "smollm" and splits as GPT-2 alone: the two differ where a space comes before a numeral
  other than an ASCII digit, "x ½", or a run of whitespace before a digit, "x   1"; kzoo gives
  SmolLM2's own ids there.) Other names are refused: their split is unknown.
- "llama": SentencePiece BPE with byte fallback, merges from the scores; Gemma's pipeline for the
  Gemma architectures (`general.architecture` "gemma", "gemma2", "gemma3": `GEMMA_ARCHITECTURES`,
  the families whose record says `gemma_vocabulary`), Llama's otherwise.
- Control tokens become special tokens and user-defined ones added tokens (both kept whole in
  text); BOS is prepended when `tokenizer.ggml.add_bos_token` says so (a "llama" file that does
  not say prepends it, as llama.cpp and transformers do).

`gguf_tokenizer_fields(tokenizer)` writes an `HFTokenizer` of those kinds as the same fields, so that
transformers' GGUF loader and `tokenizer_from_gguf` read back its ids and chat template. What a GGUF
cannot hold is refused, except a `NFC` normalizer (Qwen2's): neither llama.cpp nor transformers
applies it to a GGUF's text, so text that is not in NFC may tokenize differently there.

Fields are plain Python values, as `gguf.GGUFReader`'s `field.contents()` gives them: strings,
ints, bools, lists. `add_gguf_fields(writer, fields)` adds them to a `gguf.GGUFWriter` with
llama.cpp's types.
"""

import json

import numpy as np
import tokenizers
from tokenizers import pre_tokenizers

from kzoo.checkpoints import families
from kzoo.tokenizers import byte_pair
from kzoo.tokenizers.chat_template import end_of_turn_token
from kzoo.tokenizers.hugging_face import HFTokenizer

MODEL = "tokenizer.ggml.model"
PRE = "tokenizer.ggml.pre"
TOKENS = "tokenizer.ggml.tokens"
TOKEN_TYPE = "tokenizer.ggml.token_type"
SCORES = "tokenizer.ggml.scores"
MERGES = "tokenizer.ggml.merges"
ADD_BOS = "tokenizer.ggml.add_bos_token"
ADD_EOS = "tokenizer.ggml.add_eos_token"
ADD_SPACE_PREFIX = "tokenizer.ggml.add_space_prefix"
CHAT_TEMPLATE = "tokenizer.chat_template"
ARCHITECTURE = "general.architecture"
# The special ids, by transformers' names for the tokens.
TOKEN_IDS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}
END_OF_TURN_ID = "tokenizer.ggml.eot_token_id"
# llama.cpp's token types.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6
# The architectures whose "llama" vocabulary is Gemma's (a record's `gemma_vocabulary`).
GEMMA_ARCHITECTURES = families.gemma_vocabulary_architectures()

# Pre-tokenizer splits (the regexes of the models' tokenizer.json files).
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _regex_split(pattern):
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(tokenizers.Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _pre_tokenizer(name):
    """The pre-tokenizer a `tokenizer.ggml.pre` name stands for."""
    if name in ("gpt-2", "default"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False)
    if name == "smollm":
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    return _regex_split(_SPLITS[name])


# llama.cpp's names for the splits, as transformers reads them; the first of each is written.
_SPLITS = {
    **dict.fromkeys(("llama-bpe", "llama3", "llama-v3", "falcon3", "smaug-bpe", "dbrx"), LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), QWEN2_SPLIT),
}
PRE_TOKENIZERS = ("gpt-2", "default", "smollm", *_SPLITS)


def tokenizer_from_gguf(fields, source=None):
    """The `HFTokenizer` of a GGUF file's metadata.

    Args:
        fields: dict of GGUF metadata key -> Python value (`field.contents()`); the `tokenizer.*`
            keys and `general.architecture` are read.
        source: the GGUF file, named in the tokenizer's warnings (a "llama" vocabulary without
            its byte tokens) and errors.

    Returns:
        An `HFTokenizer` with the file's special tokens and chat template.

    Raises:
        ValueError: naming the field, for a tokenizer kind kzoo does not read or a malformed field.
    """
    model = _field(fields, MODEL, str)
    if model not in ("gpt2", "llama"):
        raise ValueError(
            f"GGUF field {MODEL} is {model!r}; kzoo reads 'gpt2' (byte-level BPE) and 'llama' (SentencePiece)."
        )
    tokens = _field(fields, TOKENS, list)
    if not tokens or not all(isinstance(token, str) for token in tokens):
        raise ValueError(f"GGUF field {TOKENS} must be a non-empty list of strings.")
    if len(set(tokens)) != len(tokens):
        first = {}
        index, token = next((i, t) for i, t in enumerate(tokens) if first.setdefault(t, i) != i)
        raise ValueError(f"GGUF field {TOKENS} holds {token!r} twice, at {first[token]} and {index}.")
    types = [NORMAL] * len(tokens) if fields.get(TOKEN_TYPE) is None else _field(fields, TOKEN_TYPE, list)
    if not all(isinstance(kind, int) and not isinstance(kind, bool) for kind in types):
        raise ValueError(f"GGUF field {TOKEN_TYPE} must be a list of integers (llama.cpp's token types).")
    if len(types) != len(tokens):
        raise ValueError(f"GGUF field {TOKEN_TYPE} has {len(types)} entries for {len(tokens)} tokens.")
    architecture = fields.get(ARCHITECTURE)
    # The file's tokens; of the tokenizer class's own, Gemma's mask token is the one it does not set.
    named = {"mask_token": "<mask>"} if model == "llama" and architecture in GEMMA_ARCHITECTURES else {}
    for name, key in TOKEN_IDS.items():
        if fields.get(key) is not None:
            token_id = _field(fields, key, int)
            if not 0 <= token_id < len(tokens):
                raise ValueError(f"GGUF field {key} is {token_id}, outside the {len(tokens)} tokens.")
            named[name] = tokens[token_id]
    if model == "gpt2":
        backend, present = _byte_level(fields, tokens)
        # A control token spelled outside the byte alphabet is a mislabel (transformers skips it).
        alphabet = set(byte_pair.byte_alphabet())
        control = [token for token, kind in zip(tokens, types) if kind == CONTROL and set(token) <= alphabet]
    else:
        gemma = architecture in GEMMA_ARCHITECTURES
        backend, present = _sentencepiece(fields, tokens, gemma, named.get("unk_token"))
        control = [token for token, kind in zip(tokens, types) if kind == CONTROL]
    user_defined = [token for token, kind in zip(tokens, types) if kind == USER_DEFINED and token in present]
    added = [(token, True) for token in control] + [(token, False) for token in user_defined]
    byte_pair.add_tokens(backend, added, named.values())
    # A "llama" file that does not say prepends BOS, as llama.cpp and transformers do.
    add_bos = model == "llama" if fields.get(ADD_BOS) is None else _field(fields, ADD_BOS, bool)
    add_eos = False if fields.get(ADD_EOS) is None else _field(fields, ADD_EOS, bool)
    byte_pair.set_post_processor(backend, named.get("bos_token"), named.get("eos_token"), add_bos, add_eos)
    template = fields.get(CHAT_TEMPLATE)
    if template is not None and not isinstance(template, str):
        raise ValueError(f"GGUF field {CHAT_TEMPLATE} must be a string; it is a {type(template).__name__}.")
    where = f"the tokenizer of {source}" if source else "the GGUF tokenizer"
    tokenizer = HFTokenizer(chat_template=template or None, tokenizer_source=where, **named)
    tokenizer.set_tokenizer(backend, copy=False)  # made here for it alone
    # Named in the template's errors (`kzoo.tokenizers.chat_template.ChatTemplateError`).
    tokenizer.chat_template_source = (
        f"the GGUF field {CHAT_TEMPLATE} of {source}" if source else f"the GGUF field {CHAT_TEMPLATE}"
    )
    return tokenizer


def _field(fields, key, kind):
    if key not in fields:
        raise ValueError(f"The GGUF metadata has no {key}.")
    value = fields[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"GGUF field {key} must be a {kind.__name__}; it is {type(value).__name__} {value!r:.60}.")
    return value


def _byte_level(fields, tokens):
    """The byte-level BPE of the file, and its vocabulary."""
    pre = fields.get(PRE, "default")
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"GGUF field {PRE} is {pre!r}, a split kzoo does not know; it reads {sorted(PRE_TOKENIZERS)}.")
    # The vocabulary in the byte alphabet: a token written in plain characters is respelled (checked over
    # all the tokens at once first: files seldom hold one).
    spelling = byte_pair.byte_alphabet()
    alphabet = set(spelling)
    if set("".join(tokens)) <= alphabet:
        vocabulary = dict(zip(tokens, range(len(tokens))))
    else:
        vocabulary = {}
        for index, token in enumerate(tokens):
            spelled = token if set(token) <= alphabet else "".join(spelling[byte] for byte in token.encode("utf-8"))
            vocabulary[spelled] = index
    return byte_pair.byte_level(vocabulary, _merges(fields, vocabulary), _pre_tokenizer(pre)), vocabulary


def _merges(fields, vocabulary):
    """The file's merges, each two tokens that make a third (checked over all of them at once; entry by
    entry only to name the first that is not)."""
    entries = _field(fields, MERGES, list)
    merges = [tuple(merge.split(" ")) if isinstance(merge, str) else () for merge in entries]
    well_formed = (
        all(len(pair) == 2 for pair in merges)
        and vocabulary.keys() >= {token for pair in merges for token in pair}
        and vocabulary.keys() >= set(map("".join, merges))
    )
    for index, (merge, pair) in enumerate([] if well_formed else zip(entries, merges)):
        if len(pair) != 2:
            raise ValueError(
                f"GGUF field {MERGES} entry {index} ({merge!r:.40}) is not two tokens separated by a space."
            )
        missing = [token for token in [*pair, "".join(pair)] if token not in vocabulary]
        if missing:
            raise ValueError(f"GGUF field {MERGES} entry {index} ({merge!r:.40}) needs {missing}, not in the tokens.")
    return merges


def _sentencepiece(fields, tokens, gemma, unk_token):
    """The SentencePiece-style BPE of the file (Gemma's pipeline or Llama's), and its vocabulary."""
    if gemma:
        # Gemma's files store a token of spaces as spaces, where its pipeline looks for "▁".
        tokens = [byte_pair.SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocabulary = {token: index for index, token in enumerate(tokens)}
    if MERGES in fields:
        merges = _merges(fields, vocabulary)
    elif gemma:
        # Gemma's scores do not follow its merge order; the order of its tokens does.
        merges = byte_pair.merges_by_rank(vocabulary, {t: -i for i, t in enumerate(tokens)}, descending=True)
    else:
        scores = _field(fields, SCORES, list)
        if not all(isinstance(score, (int, float)) and not isinstance(score, bool) for score in scores):
            raise ValueError(f"GGUF field {SCORES} must be a list of numbers.")
        if len(scores) != len(tokens):
            raise ValueError(f"GGUF field {SCORES} has {len(scores)} entries for {len(tokens)} tokens.")
        merges = byte_pair.merges_by_rank(vocabulary, dict(zip(tokens, scores)), descending=True)
    if gemma:
        return byte_pair.sentencepiece_gemma(vocabulary, merges, unk_token), vocabulary
    return byte_pair.sentencepiece_llama(vocabulary, merges), vocabulary


def gguf_tokenizer_fields(tokenizer):
    """The GGUF metadata of an `HFTokenizer` (see the module docstring): byte-level BPE as "gpt2",
    SentencePiece-style BPE (byte fallback, "▁" for spaces) as "llama" with scores that order its
    merges, the special ids, `add_bos_token` / `add_eos_token`, the end-of-turn id
    (`tokenizer.ggml.eot_token_id`, for llama.cpp) and the chat template.

    A SentencePiece-style tokenizer reads back with Gemma's pipeline for the Gemma architectures
    and Llama's otherwise: write a Gemma tokenizer (spaces as "▁", no prefix) with a Gemma
    architecture, a Llama one (a "▁" before the text) with another.

    Raises:
        ValueError: for a tokenizer a GGUF cannot hold (its pre-tokenizer, normalizer or merges).
    """
    data = json.loads(tokenizer.backend.to_str())
    model = data.get("model") or {}
    if model.get("type") != "BPE":
        raise ValueError(f"A GGUF holds BPE tokenizers; this one is {model.get('type')!r}.")
    vocabulary = tokenizer.get_vocabulary()
    merges = [tuple(merge.split(" ")) if isinstance(merge, str) else tuple(merge) for merge in model.get("merges", [])]
    added = {token.content: token.special for token in tokenizer.backend.get_added_tokens_decoder().values()}
    types = [CONTROL if added.get(token) else USER_DEFINED if token in added else NORMAL for token in vocabulary]
    if model.get("byte_fallback"):
        fields = {MODEL: "llama", PRE: "default", **_sentencepiece_fields(data, vocabulary, merges)}
        for index, token in enumerate(vocabulary):
            if types[index] == NORMAL and len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
                types[index] = BYTE
        if tokenizer.unk_token is not None:
            types[tokenizer.unk_token_id] = UNKNOWN
    else:
        fields = {MODEL: "gpt2", PRE: _pre_name(data), MERGES: [" ".join(merge) for merge in merges]}
    fields.update({TOKENS: vocabulary, TOKEN_TYPE: types})
    for name, key in TOKEN_IDS.items():
        if getattr(tokenizer, name) is not None:
            fields[key] = tokenizer.token_to_id(getattr(tokenizer, name))
    start, end = _ends(tokenizer)
    if start not in (None, tokenizer.bos_token_id) or end not in (None, tokenizer.eos_token_id):
        raise ValueError(
            "A GGUF can only say whether BOS goes before a text and EOS after it; this tokenizer's post-processor "
            f"adds {tokenizer.id_to_token(start) if start is not None else None!r} before and "
            f"{tokenizer.id_to_token(end) if end is not None else None!r} after."
        )
    fields.update({ADD_BOS: start is not None, ADD_EOS: end is not None})
    end_of_turn = end_of_turn_token(tokenizer)
    if end_of_turn is not None:
        fields[END_OF_TURN_ID] = tokenizer.token_to_id(end_of_turn)
    if tokenizer.chat_template:
        fields[CHAT_TEMPLATE] = tokenizer.chat_template
    return fields


def _ends(tokenizer):
    """The ids the post-processor puts before and after a text (None for none)."""
    encoding = tokenizer.backend.encode("a", add_special_tokens=True)
    text = [index for index, sequence in enumerate(encoding.sequence_ids) if sequence is not None]
    before, after = encoding.ids[: text[0]], encoding.ids[text[-1] + 1 :]
    if len(before) > 1 or len(after) > 1:
        raise ValueError(
            f"A GGUF can add one token before and one after a text; this tokenizer adds {before}, {after}."
        )
    return (before[0] if before else None), (after[0] if after else None)


def _pre_name(data):
    """The `tokenizer.ggml.pre` name of a byte-level tokenizer.json's normalizer and pre-tokenizer."""
    normalizer = data.get("normalizer")
    if normalizer is not None and normalizer.get("type") != "NFC":
        raise ValueError(f"A GGUF cannot hold the normalizer {normalizer.get('type')!r} (only NFC, which it drops).")
    pre = data.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    kinds = [step.get("type") for step in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits") and steps[1].get("use_regex", True):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True):
        pattern = (steps[0].get("pattern") or {}).get("Regex")
        names = [name for name, split in _SPLITS.items() if split == pattern]
        if names and steps[0].get("behavior") == "Isolated" and not steps[0].get("invert"):
            return names[0]
    raise ValueError(
        f"A GGUF names its split; this byte-level tokenizer's pre-tokenizer {json.dumps(pre)[:300]} is none of "
        "GPT-2's, SmolLM's (digits, then GPT-2's), Llama 3's or Qwen2's."
    )


def _sentencepiece_fields(data, vocabulary, merges):
    """Scores that order `merges` (llama.cpp and transformers derive the merges from them), and
    whether a "▁" goes before the text."""
    normalizer = data.get("normalizer") or {}
    pre = data.get("pre_tokenizer") or {}
    steps = normalizer.get("normalizers", []) if normalizer.get("type") == "Sequence" else [normalizer]
    steps = [step for step in steps if step]
    kinds = [step.get("type") for step in steps]
    spaces = [{"type": "Replace", "pattern": {"String": " "}, "content": byte_pair.SPACE}]
    if not steps and pre.get("type") == "Metaspace" and pre.get("replacement") == byte_pair.SPACE:
        prefix = pre.get("prepend_scheme") != "never"  # Llama as transformers builds it
    elif steps == spaces and (not pre or (pre.get("type") == "Split" and pre.get("pattern") == {"String": " "})):
        prefix = False  # Gemma
    elif kinds == ["Prepend", "Replace"] and steps[1:] == spaces and not pre:
        prefix = True  # Llama 2's tokenizer.json
    else:
        raise ValueError(
            "A GGUF's SentencePiece tokenizer writes spaces as '▁', with or without one before the text; this "
            f"tokenizer's normalizer {json.dumps(normalizer)[:200]} and pre-tokenizer {json.dumps(pre)[:200]} do not."
        )
    ids = {token: index for index, token in enumerate(vocabulary)}
    # A merged token scores by its first merge: earlier merges score higher, other tokens lowest.
    rank = {}
    for index, (left, right) in enumerate(merges):
        rank.setdefault(left + right, index)
    scores = [-float(rank.get(token, len(merges))) for token in vocabulary]
    implied = byte_pair.merges_by_rank(ids, dict(zip(vocabulary, scores)), descending=True)
    if not _same_merges(implied, merges):
        raise ValueError(
            "A GGUF's SentencePiece tokenizer merges every pair of tokens that spells a token, best-scored first; "
            "this tokenizer's merges are not all of them, so no scores express them."
        )
    return {SCORES: scores, ADD_SPACE_PREFIX: prefix}


def _same_merges(implied, merges):
    """Whether two merge lists tokenize alike: the same merges, and the tokens they make in the
    same order (the order among the merges that make one token does not matter)."""
    if set(implied) != set(merges):
        return False

    def order(pairs):
        return list(dict.fromkeys(left + right for left, right in pairs))

    return order(implied) == order(merges)


def add_gguf_fields(writer, fields):
    """Adds `fields` (as `gguf_tokenizer_fields` gives them) to a `gguf.GGUFWriter`, each with
    llama.cpp's type (uint32 ids, int32 token types, float32 scores, string arrays)."""
    methods = {
        MODEL: "add_tokenizer_model",
        PRE: "add_tokenizer_pre",
        TOKENS: "add_token_list",
        TOKEN_TYPE: "add_token_types",
        SCORES: "add_token_scores",
        MERGES: "add_token_merges",
        ADD_BOS: "add_add_bos_token",
        ADD_EOS: "add_add_eos_token",
        ADD_SPACE_PREFIX: "add_add_space_prefix",
        CHAT_TEMPLATE: "add_chat_template",
        END_OF_TURN_ID: "add_eot_token_id",
        TOKEN_IDS["bos_token"]: "add_bos_token_id",
        TOKEN_IDS["eos_token"]: "add_eos_token_id",
        TOKEN_IDS["unk_token"]: "add_unk_token_id",
        TOKEN_IDS["pad_token"]: "add_pad_token_id",
    }
    unknown = sorted(set(fields) - set(methods))
    if unknown:
        raise ValueError(f"No GGUF writer for the fields {unknown}.")
    for key, value in fields.items():
        getattr(writer, methods[key])(np.asarray(value, "float32").tolist() if key == SCORES else value)
