"""GPT presets. kzoo ships no weights: these build randomly initialized models."""

GPT_PRESETS = {
    "gpt_tiny": {
        "class_name": "GPTBackbone",
        "config": {
            "vocabulary_size": 256,
            "num_layers": 2,
            "num_heads": 4,
            "hidden_dim": 128,
            "intermediate_dim": 512,
            "max_sequence_length": 256,
        },
        "description": "Byte-level GPT, 2 layers x 128 (0.5M parameters); trains on a CPU in minutes.",
    },
    "gpt_small": {
        "class_name": "GPTBackbone",
        "config": {
            "vocabulary_size": 8192,
            "num_layers": 4,
            "num_heads": 4,
            "hidden_dim": 256,
            "intermediate_dim": 1024,
            "max_sequence_length": 256,
        },
        "description": "GPT with an 8k vocabulary, 4 layers x 256 (5.3M parameters).",
    },
    "gpt2_small": {
        "class_name": "GPTBackbone",
        "config": {
            "vocabulary_size": 50257,
            "num_layers": 12,
            "num_heads": 12,
            "hidden_dim": 768,
            "intermediate_dim": 3072,
            "max_sequence_length": 1024,
        },
        "description": "GPT-2 small (Radford et al., 2019): 12 layers x 768, 124,439,808 parameters.",
    },
}
