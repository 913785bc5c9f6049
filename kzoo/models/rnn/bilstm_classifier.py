import keras

from kzoo.models.rnn.recurrent_stack import recurrent_stack
from kzoo.models.task import StandaloneTask
from kzoo.validation import check_choice
from kzoo.validation import check_positive_int


@keras.saving.register_keras_serializable(package="kzoo")
class BiLSTMClassifier(StandaloneTask):
    """A bidirectional LSTM classifier: one label per sequence (sentiment, topic) or per token (tags).

    Each token's state concatenates a forward LSTM over the tokens before it
    and a backward LSTM over the tokens after it, so every state sees the
    whole sequence:

        h_t = [LSTM_fwd(x_1..x_t); LSTM_bwd(x_T..x_t)]     (stacked num_layers times)
        logits = W mean_{t real}(h_t) + b                  (pooling="mean", float32)
        logits_t = W h_t + b                               (pooling=None: a tagger)

    Mean pooling uses every position's state rather than only the final one,
    which would favour the last few tokens.

    Padding: id 0 is padding. Both directions skip padded steps (the
    backward LSTM starts at the last real token), so the states of real
    tokens do not depend on the amount of padding; the mean is over real
    tokens only (every row needs one), and a tagger's logits carry the
    padding mask, so Keras losses and metrics leave padded positions out.

    Training: `x` token ids `(B, T)`; `y` class ids `(B,)` with mean pooling,
    `(B, T)` without (any value at padded positions).

    Args:
        vocabulary_size: int, number of token ids V.
        num_classes: int, number of classes (or tags).
        embedding_dim: int, width of the token vectors.
        hidden_dim: int, LSTM units per direction (states are 2 * hidden_dim wide).
        num_layers: int, number of stacked bidirectional layers.
        dropout: float in [0, 1), on the embeddings and after each layer.
        pooling: "mean" (one label per sequence) or None (one label per token).
        dtype: None or a dtype policy for every layer but the float32 output.
        **kwargs: `keras.Model` arguments (`name`).

    Example:
    >>> classifier = BiLSTMClassifier(vocabulary_size=1000, num_classes=2, embedding_dim=32, hidden_dim=64)
    >>> tuple(classifier(keras.ops.ones((2, 10), "int32")).shape)
    (2, 2)
    >>> tagger = BiLSTMClassifier(1000, 17, 32, 64, pooling=None)
    >>> tuple(tagger(keras.ops.ones((2, 10), "int32")).shape)
    (2, 10, 17)

    References:
        Graves & Schmidhuber, "Framewise phoneme classification with
        bidirectional LSTM", 2005.
        Huang et al., "Bidirectional LSTM-CRF Models for Sequence Tagging", 2015.
    """

    def __init__(
        self,
        vocabulary_size,
        num_classes,
        embedding_dim,
        hidden_dim,
        num_layers=1,
        dropout=0.0,
        pooling="mean",
        dtype=None,
        **kwargs,
    ):
        check_positive_int("num_classes", num_classes)
        check_choice("pooling", pooling, ("mean", None))

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
        if pooling == "mean":
            x = keras.layers.GlobalAveragePooling1D(dtype=dtype, name="mean_pooling")(x)  # (B, 2 * hidden_dim), masked
        # float32 so that the logits are float32 under mixed precision.
        logits = keras.layers.Dense(num_classes, dtype="float32", name="logits")(x)  # (B, [T,] num_classes)
        super().__init__(inputs=token_ids, outputs=logits, dtype=dtype, **kwargs)

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.num_classes = num_classes
        self.embedding_dim = embedding_dim
        self.hidden_dim = hidden_dim
        self.num_layers = num_layers
        self.dropout = dropout
        self.pooling = pooling

    @property
    def serving_task(self):
        """What export serves: "classifier" (one label per sequence) or "tagger"."""
        return "classifier" if self.pooling else "tagger"

    def get_config(self):
        config = super().get_config()
        config.update(
            vocabulary_size=self.vocabulary_size,
            num_classes=self.num_classes,
            embedding_dim=self.embedding_dim,
            hidden_dim=self.hidden_dim,
            num_layers=self.num_layers,
            dropout=self.dropout,
            pooling=self.pooling,
        )
        return config
