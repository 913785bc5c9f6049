"""Moved to `kzoo.tokenizers.tokenizer_json` (this path keeps old imports working)."""

from kzoo._moved import moved

__getattr__ = moved(__name__)
