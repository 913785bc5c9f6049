"""Hugging Face folders: safetensors weights, config.json and the tokenizer files."""
