"""Checkpoint files: Hugging Face folders, GGUF files, keras-hub presets, and one record per model family.

Below `kzoo.models`: it reads and writes files and tensor maps; the models build themselves.
"""
