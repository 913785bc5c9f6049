"""Tokenizers: every kind kzoo reads, trains or writes, chat templates and text packing.

Below `kzoo.models`, `kzoo.data` and `kzoo.checkpoints`: nothing here imports them.
"""
