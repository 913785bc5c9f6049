"""Tokenizers: every kind kzoo reads, trains or writes, chat templates and text packing.

Below `kzoo.models`, `kzoo.data` and `kzoo.checkpoints`: nothing here imports them.

- `characters`: `CharacterTokenizer`, one id per character, its code point.
- `word_piece`: WordPiece vocabularies fitted on a corpus (`train_word_piece_vocabulary`,
  `word_piece_tokenizer`), kzoo's reserved tokens (`SPECIAL_TOKENS`), and a tokenizer saved
  beside a model (`save_tokenizer`, `load_tokenizer`).
- `bert`: `BertTokenizer`, BERT's WordPiece with the ids of Hugging Face's `tokenizers`.
- `hugging_face`: `HFTokenizer`, a `tokenizer.json` run by the `tokenizers` package (the Llama
  lineage), with its special tokens and chat template.
- `byte_pair`: the `tokenizers` pipelines of byte-level and SentencePiece BPE vocabularies.
- `tokenizer_json`: a kzoo tokenizer as a Hugging Face `tokenizer.json` (`hugging_face_tokenizer`).
- `chat_template`: the bounded Jinja renderer of chat templates (`render_chat_template`).
- `packing`: text to a model's inputs (`pack`), prompts and special ids.

The Hugging Face folders' and GGUF files' tokenizer fields are read and written in
`kzoo.checkpoints.hf.tokenizer_files` and `kzoo.checkpoints.gguf.tokenizer`.

The names below are imported on first use: keras-hub, tensorflow-text and `tokenizers` take
seconds to import, and `import kzoo` does not need them.

Example:
>>> tokenizer = kzoo.tokenizers.character_tokenizer(128)
>>> tokenizer("Hi").tolist()
[72, 105]
"""

import importlib

# Each public name and its module.
_PUBLIC = {
    "BertTokenizer": "bert",
    "CharacterTokenizer": "characters",
    "ChatTemplateError": "chat_template",
    "HFTokenizer": "hugging_face",
    "SPECIAL_TOKENS": "word_piece",
    "character_tokenizer": "word_piece",
    "hugging_face_tokenizer": "tokenizer_json",
    "load_tokenizer": "word_piece",
    "render_chat_template": "chat_template",
    "save_tokenizer": "word_piece",
    "train_word_piece_vocabulary": "word_piece",
    "word_piece_tokenizer": "word_piece",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name):
    if name in _PUBLIC:
        return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_PUBLIC})
