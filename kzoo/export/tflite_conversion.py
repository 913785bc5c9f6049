"""Moved to `kzoo.export.tflite.convert` and `kzoo.export.tflite.graph_passes` (this path keeps old imports working)."""

from kzoo._moved import moved

__getattr__ = moved(__name__)
