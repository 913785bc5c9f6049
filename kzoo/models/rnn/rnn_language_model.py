import keras

from kzoo.models.perplexity import Perplexity
from kzoo.models.rnn.recurrent_stack import recurrent_stack
from kzoo.models.task import StandaloneTask


@keras.saving.register_keras_serializable(package="kzoo")
class RNNLanguageModel(StandaloneTask):
    """A recurrent language model: embedding, stacked LSTM/GRU/RNN, softmax over the vocabulary.

    The baseline the Transformer replaced: the state h_t summarises the
    whole prefix w_<=t in a fixed-size vector, updated one token at a time,
    and P(w_{t+1} | w_<=t) = softmax(W h_t + b). Training runs over the
    sequence step by step (no parallelism across positions), and
    information from far back must survive every update on the way.

        h_0 = Dropout(E[w])
        h_l = Dropout(RNN_l(h_{l-1}))    (l = 1..num_layers)
        logits = W h_L + b               (float32)

    Padding: id 0 is padding. The recurrent layers skip padded steps and the
    logits carry the padding mask, so Keras losses and metrics (and
    `Perplexity`) leave padded positions out even without a `sample_weight`.

    Training: `x = ids[:, :-1]`, `y = ids[:, 1:]`. `compile()` defaults add
    `Perplexity` to the accuracy.

    Args:
        vocabulary_size: int, number of token ids V.
        embedding_dim: int, width of the token vectors.
        hidden_dim: int, units of each recurrent layer.
        num_layers: int, number of stacked recurrent layers.
        cell: "lstm" (Hochreiter & Schmidhuber, 1997), "gru" (Cho et al.,
            2014) or "rnn" (Elman's tanh RNN).
        dropout: float in [0, 1), on the embeddings and after each layer
            (not on the recurrence).
        dtype: None or a dtype policy for every layer but the float32 output.
        **kwargs: `keras.Model` arguments (`name`).

    Example:
    >>> model = RNNLanguageModel(vocabulary_size=128, embedding_dim=32, hidden_dim=64)
    >>> tuple(model(keras.ops.ones((2, 10), "int32")).shape)
    (2, 10, 128)

    References:
        Mikolov et al., "Recurrent neural network based language model", 2010.
        Zaremba et al., "Recurrent Neural Network Regularization", 2014.
    """

    def __init__(
        self,
        vocabulary_size,
        embedding_dim,
        hidden_dim,
        num_layers=1,
        cell="lstm",
        dropout=0.0,
        dtype=None,
        **kwargs,
    ):
        # === Functional model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        x = recurrent_stack(
            token_ids, vocabulary_size, embedding_dim, hidden_dim, num_layers, cell, dropout=dropout, dtype=dtype
        )  # (B, T, hidden_dim)
        # A float32 layer: it casts the states up, so the logits (and the
        # softmax of the loss) are float32 under mixed precision.
        logits = keras.layers.Dense(vocabulary_size, dtype="float32", name="logits")(x)  # (B, T, V)
        super().__init__(inputs=token_ids, outputs=logits, dtype=dtype, **kwargs)

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.embedding_dim = embedding_dim
        self.hidden_dim = hidden_dim
        self.num_layers = num_layers
        self.cell = cell
        self.dropout = dropout

    def default_metrics(self):
        return super().default_metrics() + [Perplexity()]

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "embedding_dim": self.embedding_dim,
                "hidden_dim": self.hidden_dim,
                "num_layers": self.num_layers,
                "cell": self.cell,
                "dropout": self.dropout,
            }
        )
        return config
