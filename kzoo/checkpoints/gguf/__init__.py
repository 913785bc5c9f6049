"""GGUF files (llama.cpp's format): reading, writing and their tokenizer fields."""
