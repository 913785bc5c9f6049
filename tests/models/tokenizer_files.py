"""Tiny tokenizers of the Llama lineage's kinds, trained here by `tokenizers` and `sentencepiece` and
written as Hugging Face folders, with the pipelines the real checkpoints' files hold."""

import io
import json
import lzma
from pathlib import Path

import sentencepiece
import tokenizers
from tokenizers import decoders
from tokenizers import models
from tokenizers import normalizers
from tokenizers import pre_tokenizers
from tokenizers import processors
from tokenizers import trainers

from kzoo import data

# Real text: accents, emoji (joiners, variation selectors), CJK, Hangul, Cyrillic, Greek, digits,
# code, punctuation and runs of whitespace.
TEXTS = [
    "Crème brûlée at the Café — naïve façade, 10% off!!",
    "Ünïcödé ÀÉÎÕÜ Straße İstanbul ΣΊΣΥΦΟΣ σοφός Ὀδυσσεύς",
    "I ❤️ emoji 😂🎉 👨‍👩‍👧 ok",
    "東京は日本の首都です。你好，世界！",
    "한국어 문장입니다. Русский текст, ещё!",
    "Wait… that's ™ ½ ² ﬁne “quoted” ‘single’ «guillemets»",
    "def area(r):\n    return 3.14159 * r ** 2  # 12345\n",
    "for (int i = 0; i < 10; ++i) { total += x[i]; }",
    "tabs\tand\nnewlines\n\n and\u00a0nbsp\u200bzero-width",
    "   leading, and trailing   ",
    "Ａｂｃ full-width ＡＢＣ１２３, on 2024-06-01: 1,000,000.5",
    "it's THEY'RE we'll I'm",
    "",
]
# Extra text the vocabularies are trained on, so that they merge more than English (code with
# indentation among it).
_CODE = "def total(values):\n    result = 0\n    for value in values:\n        result += value\n    return result\n"
_EXTRA = "\n".join(TEXTS[1:8] * 3) + (_CODE + "x   = [\n    1,\n    22,\n]\n") * 20

# The chat-control tokens of the byte-level kinds, as in the real files.
BYTE_LEVEL_SPECIALS = {
    "llama3": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    "smollm": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    "gpt2": ["<|endoftext|>"],
}
# Each kind's tokenizer_config.json: its class and named tokens, as the real checkpoints'.
BYTE_LEVEL_SETTINGS = {
    "llama3": {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
    },
    "qwen2": {"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    # SmolLM2's says GPT2Tokenizer, which transformers 5 rebuilds without the Digits step
    # (see test_hf_tokenizers): this one runs tokenizer.json as it is.
    "smollm": {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
    },
    "gpt2": {"tokenizer_class": "GPT2Tokenizer", **dict.fromkeys(("bos_token", "eos_token"), "<|endoftext|>")},
}
# The Split regexes of Llama 3's and Qwen2's tokenizer.json.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def corpus():
    """Spanish and English sentence pairs, and the extra text."""
    with lzma.open(data.corpus_dir() / "spa-eng" / "spa.txt.xz", "rt", encoding="utf-8") as file:
        return file.read()[:100000] + _EXTRA


def byte_level_tokenizer(kind, vocabulary_size=800):
    """A byte-level BPE of `kind` ("llama3", "qwen2", "smollm", "gpt2"), with its split."""
    split = {"behavior": "isolated"}
    pre = {
        "llama3": [
            pre_tokenizers.Split(tokenizers.Regex(LLAMA3_SPLIT), **split),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ],
        "qwen2": [
            pre_tokenizers.Split(tokenizers.Regex(QWEN2_SPLIT), **split),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ],
        "smollm": [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)],
        "gpt2": [pre_tokenizers.ByteLevel(add_prefix_space=False)],
    }[kind]
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre[0] if len(pre) == 1 else pre_tokenizers.Sequence(pre)
    if kind == "qwen2":
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocabulary_size,
        special_tokens=BYTE_LEVEL_SPECIALS[kind],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([corpus()], trainer)
    if kind == "llama3":
        bos = "<|begin_of_text|>"
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tokenizer.token_to_id(bos))]
        )
    return tokenizer


def write_byte_level_folder(folder, kind, chat_template=None):
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    byte_level_tokenizer(kind).save(str(folder / "tokenizer.json"))
    settings = dict(BYTE_LEVEL_SETTINGS[kind])
    if chat_template:
        settings["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(settings), encoding="utf-8")
    return folder


def sentencepiece_model(kind, vocabulary_size=1000):
    """A SentencePiece BPE `tokenizer.model` (bytes) trained like Llama 2's ("llama": a "▁" before
    the text, <s> </s>) or Gemma's ("gemma": no prefix, <pad> <eos> <bos> <unk> <mask> and chat
    turns as user-defined pieces): byte fallback, digits split, whitespace kept."""
    ids = (
        dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
        if kind == "llama"
        else dict(
            pad_id=0,
            eos_id=1,
            bos_id=2,
            unk_id=3,
            pad_piece="<pad>",
            eos_piece="<eos>",
            bos_piece="<bos>",
            user_defined_symbols=["<mask>", "<start_of_turn>", "<end_of_turn>"],
        )
    )
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus().splitlines()),
        model_writer=model,
        vocab_size=vocabulary_size,
        model_type="bpe",
        byte_fallback=True,
        split_digits=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=kind == "llama",
        allow_whitespace_only_pieces=True,
        character_coverage=1.0,
        minloglevel=2,
        **ids,
    )
    return model.getvalue()


# tokenizer_config.json of the SentencePiece kinds, as Llama 2's and Gemma's.
SENTENCEPIECE_SETTINGS = {
    "llama": {
        "tokenizer_class": "LlamaTokenizer",
        "add_bos_token": True,
        "add_eos_token": False,
        "legacy": False,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
    },
    "gemma": {"tokenizer_class": "GemmaTokenizer", "add_bos_token": True, "add_eos_token": False},
}


def write_sentencepiece_folder(folder, kind, chat_template=None):
    """A folder with only `tokenizer.model` and `tokenizer_config.json`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.model").write_bytes(sentencepiece_model(kind))
    settings = dict(SENTENCEPIECE_SETTINGS[kind])
    if chat_template:
        settings["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(settings), encoding="utf-8")
    return folder
