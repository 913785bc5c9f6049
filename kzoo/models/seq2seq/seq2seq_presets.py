"""Transformer (seq2seq) presets. kzoo ships no weights: these build randomly initialized models.

`transformer_base` and `transformer_big` are the two models of Table 3 of the paper with
its shared 37000-token English-German BPE vocabulary (tied source, target and output
embeddings); the parameter counts are derived in `tests/models/test_seq2seq.py`.
"""

SEQ2SEQ_PRESETS = {
    "transformer_tiny": {
        "class_name": "Seq2SeqBackbone",
        "config": {
            "vocabulary_size": 1000,
            "num_encoder_layers": 2,
            "num_decoder_layers": 2,
            "num_heads": 4,
            "hidden_dim": 64,
            "intermediate_dim": 256,
            "max_sequence_length": 128,
        },
        "description": (
            "Transformer, 2+2 layers x 64, 1k shared vocabulary (0.3M parameters); trains on a CPU in minutes."
        ),
    },
    "transformer_small": {
        "class_name": "Seq2SeqBackbone",
        "config": {
            "vocabulary_size": 8192,
            "num_encoder_layers": 3,
            "num_decoder_layers": 3,
            "num_heads": 4,
            "hidden_dim": 256,
            "intermediate_dim": 1024,
            "max_sequence_length": 256,
        },
        "description": "Transformer, 3+3 layers x 256, 8k shared vocabulary (7.6M parameters).",
    },
    "transformer_base": {
        "class_name": "Seq2SeqBackbone",
        "config": {
            "vocabulary_size": 37000,
            "num_encoder_layers": 6,
            "num_decoder_layers": 6,
            "num_heads": 8,
            "hidden_dim": 512,
            "intermediate_dim": 2048,
            "max_sequence_length": 1024,
            "dropout": 0.1,
        },
        "description": "Transformer base (Vaswani et al., 2017, Table 3): 6+6 layers x 512, 63,082,496 parameters.",
    },
    "transformer_big": {
        "class_name": "Seq2SeqBackbone",
        "config": {
            "vocabulary_size": 37000,
            "num_encoder_layers": 6,
            "num_decoder_layers": 6,
            "num_heads": 16,
            "hidden_dim": 1024,
            "intermediate_dim": 4096,
            "max_sequence_length": 1024,
            # The paper's P_drop for big on English-German (0.1 on English-French).
            "dropout": 0.3,
        },
        "description": "Transformer big (Vaswani et al., 2017, Table 3): 6+6 layers x 1024, 214,245,376 parameters.",
    },
}
