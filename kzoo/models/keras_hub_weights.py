"""Moved to `kzoo.checkpoints.keras_hub` (this path keeps old imports working)."""

from kzoo._moved import moved

__getattr__ = moved(__name__)
