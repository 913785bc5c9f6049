"""Moved to `kzoo.checkpoints.hf` and `kzoo.checkpoints.tensor_maps` (this path keeps old imports working)."""

from kzoo._moved import moved

__getattr__ = moved(__name__)
