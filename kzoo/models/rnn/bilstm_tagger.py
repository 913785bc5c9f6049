import keras

from kzoo.models.rnn.bilstm_classifier import BiLSTMClassifier
from kzoo.validation import check_positive_int


@keras.saving.register_keras_serializable(package="kzoo")
class BiLSTMTagger(BiLSTMClassifier):
    """A bidirectional LSTM tagger: `BiLSTMClassifier(..., pooling=None)` with `num_labels` tags.

    One label per token (part-of-speech, named entities); see
    `BiLSTMClassifier` for the model. Kept under this name and with these
    arguments so that code and `.keras` files that use it keep working.

    Args:
        vocabulary_size: int, number of token ids V.
        num_labels: int, number of tags.
        embedding_dim: int, width of the token vectors.
        hidden_dim: int, LSTM units per direction.
        num_layers: int, number of stacked bidirectional layers.
        dropout: float in [0, 1), on the embeddings and after each layer.
        dtype: None or a dtype policy for every layer but the float32 output.
        **kwargs: `keras.Model` arguments (`name`).

    Example:
    >>> tagger = BiLSTMTagger(vocabulary_size=1000, num_labels=17, embedding_dim=32, hidden_dim=64)
    >>> tuple(tagger(keras.ops.ones((2, 10), "int32")).shape)
    (2, 10, 17)
    """

    def __init__(
        self, vocabulary_size, num_labels, embedding_dim, hidden_dim, num_layers=1, dropout=0.0, dtype=None, **kwargs
    ):
        check_positive_int("num_labels", num_labels)  # named as the caller wrote it
        super().__init__(
            vocabulary_size,
            num_labels,
            embedding_dim,
            hidden_dim,
            num_layers=num_layers,
            dropout=dropout,
            pooling=None,
            dtype=dtype,
            **kwargs,
        )
        self.num_labels = num_labels

    def get_config(self):
        config = super().get_config()
        del config["pooling"]
        config["num_labels"] = config.pop("num_classes")
        return config
