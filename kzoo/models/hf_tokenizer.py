"""Split into `kzoo.tokenizers.bert`, `kzoo.tokenizers.hugging_face`, `kzoo.checkpoints.hf.tokenizer_files`."""

from kzoo._moved import moved

__getattr__ = moved(__name__)
