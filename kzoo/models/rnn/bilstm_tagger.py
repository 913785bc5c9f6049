import keras

from kzoo.validation import check_positive_int
from kzoo.models.rnn.recurrent_stack import recurrent_stack
from kzoo.models.task import Task


@keras.saving.register_keras_serializable(package="kzoo")
class BiLSTMTagger(Task):
    """A bidirectional LSTM sequence tagger (part-of-speech, named entities): one label per token.

    Each token's state concatenates a forward LSTM over the tokens before it
    and a backward LSTM over the tokens after it, so every label sees the
    whole sentence:

        h_t = [LSTM_fwd(x_1..x_t); LSTM_bwd(x_T..x_t)]     (stacked num_layers times)
        logits_t = W h_t + b                               (float32)

    Padding: id 0 is padding. Both directions skip padded steps (the
    backward LSTM starts at the last real token), so the states of real
    tokens do not depend on the amount of padding; the logits carry the
    padding mask, so Keras losses and metrics leave padded positions out.

    Training: `x` token ids `(B, T)`, `y` label ids `(B, T)` (any value at
    padded positions).

    Args:
        vocabulary_size: int, number of token ids V.
        num_labels: int, number of tags.
        embedding_dim: int, width of the token vectors.
        hidden_dim: int, LSTM units per direction (states are 2 * hidden_dim wide).
        num_layers: int, number of stacked bidirectional layers.
        dropout: float in [0, 1), on the embeddings and after each layer.
        dtype: None or a dtype policy for every layer but the float32 output.
        **kwargs: `keras.Model` arguments (`name`).

    Example:
    >>> tagger = BiLSTMTagger(vocabulary_size=1000, num_labels=17, embedding_dim=32, hidden_dim=64)
    >>> tagger(keras.ops.ones((2, 10), "int32")).shape
    (2, 10, 17)

    References:
        Graves & Schmidhuber, "Framewise phoneme classification with
        bidirectional LSTM", 2005.
        Huang et al., "Bidirectional LSTM-CRF Models for Sequence Tagging", 2015.
    """

    def __init__(
        self,
        vocabulary_size,
        num_labels,
        embedding_dim,
        hidden_dim,
        num_layers=1,
        dropout=0.0,
        dtype=None,
        **kwargs,
    ):
        check_positive_int("num_labels", num_labels)

        # === Functional model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        x = recurrent_stack(
            token_ids,
            vocabulary_size,
            embedding_dim,
            hidden_dim,
            num_layers,
            cell="lstm",
            bidirectional=True,
            dropout=dropout,
            dtype=dtype,
        )  # (B, T, 2 * hidden_dim)
        # float32 so that the logits are float32 under mixed precision.
        logits = keras.layers.Dense(num_labels, dtype="float32", name="logits")(x)  # (B, T, num_labels)
        super().__init__(inputs=token_ids, outputs=logits, **kwargs)
        # Functional models take no `dtype` (see `Backbone`); the policy also
        # tells `compile` to scale the loss under "mixed_float16".
        if dtype is not None:
            self.dtype_policy = keras.dtype_policies.get(dtype)

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.num_labels = num_labels
        self.embedding_dim = embedding_dim
        self.hidden_dim = hidden_dim
        self.num_layers = num_layers
        self.dropout = dropout

    def get_config(self):
        # Not chained to `Task.get_config`: there is no backbone to rebuild.
        return {
            "name": self.name,
            "dtype": keras.dtype_policies.serialize(self.dtype_policy),
            "vocabulary_size": self.vocabulary_size,
            "num_labels": self.num_labels,
            "embedding_dim": self.embedding_dim,
            "hidden_dim": self.hidden_dim,
            "num_layers": self.num_layers,
            "dropout": self.dropout,
        }
