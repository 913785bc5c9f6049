"""Moved to `kzoo.checkpoints.gguf` (this path keeps old imports working)."""

from kzoo._moved import moved

__getattr__ = moved(__name__)
