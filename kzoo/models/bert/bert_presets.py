"""BERT presets. kzoo ships no weights: these build randomly initialized models.

The vocabulary size is that of the uncased English WordPiece vocabulary.
"""

_UNCASED_VOCABULARY_SIZE = 30522

BERT_PRESETS = {
    "bert_tiny": {
        "class_name": "BertBackbone",
        "config": {
            "vocabulary_size": _UNCASED_VOCABULARY_SIZE,
            "num_layers": 2,
            "num_heads": 2,
            "hidden_dim": 128,
            "intermediate_dim": 512,
            "max_sequence_length": 512,
        },
        "description": (
            "BERT-Tiny (Turc et al., 2019): 2 layers x 128, 4.4M parameters; fine-tunes on a CPU in minutes."
        ),
    },
    "bert_small": {
        "class_name": "BertBackbone",
        "config": {
            "vocabulary_size": _UNCASED_VOCABULARY_SIZE,
            "num_layers": 4,
            "num_heads": 8,
            "hidden_dim": 512,
            "intermediate_dim": 2048,
            "max_sequence_length": 512,
        },
        "description": "BERT-Small (Turc et al., 2019): 4 layers x 512, 28.8M parameters.",
    },
    "bert_base_uncased": {
        "class_name": "BertBackbone",
        "config": {
            "vocabulary_size": _UNCASED_VOCABULARY_SIZE,
            "num_layers": 12,
            "num_heads": 12,
            "hidden_dim": 768,
            "intermediate_dim": 3072,
            "max_sequence_length": 512,
        },
        "description": "BERT-base uncased (Devlin et al., 2019): 12 layers x 768, 109,482,240 parameters.",
    },
}
