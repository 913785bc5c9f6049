import keras

from kzoo.models.feed_forward.context_window import ContextWindow
from kzoo.models.perplexity import Perplexity
from kzoo.models.task import StandaloneTask
from kzoo.ops import get_activation
from kzoo.validation import check_positive_int
from kzoo.validation import check_rate


@keras.saving.register_keras_serializable(package="kzoo")
class FeedForwardLanguageModel(StandaloneTask):
    """Bengio et al.'s neural probabilistic language model over a sliding window of n tokens.

    The neural n-gram model that preceded the RNN LMs: a fixed window of the
    n last tokens w_{t-n+1..t}, each mapped to a learned vector C(w),
    concatenated and passed through hidden layers, predicts the next token.
    Unlike an RNN it sees nothing before its window, and unlike a transformer
    it weighs the window's positions with fixed weights; every position is
    computed independently, so all T predictions of a sequence come out of
    one parallel pass (no recurrence).

        h_0 = Dropout([C(w_{t-n+1}); ...; C(w_t)])   (n * embedding_dim)
        h_l = Dropout(act(H_l h_{l-1} + d_l))        (l = 1..num_layers)
        logits_t = U h_L + b                          (float32)
        P(w_{t+1} | w_{t-n+1..t}) = softmax(logits_t)

    so it is an (n+1)-gram model in the paper's counting. The paper's
    optional direct connections W h_0 from the window to the output are left
    out.

    Padding: id 0 is padding. Window slots before the start of the sequence
    and slots holding id 0 contribute zero vectors (not the embedding of
    id 0), so a position's logits depend only on the real tokens among
    w_{t-n+1..t} and left padding does not change them. The logits carry the
    padding mask, so Keras losses and metrics (and `Perplexity`) leave padded
    positions out even without a `sample_weight`.

    Training: `x = ids[:, :-1]`, `y = ids[:, 1:]`, as for the GPT and RNN
    language models. `compile()` defaults add `Perplexity` to the accuracy.

    Args:
        vocabulary_size: int, number of token ids V.
        window_size: int n >= 1, the tokens each prediction sees (the current
            one included).
        embedding_dim: int, width of the token vectors C(w).
        hidden_dim: int, units of each hidden layer.
        num_layers: int >= 1, number of hidden layers.
        activation: the hidden layers' activation: "tanh" (the paper's) or
            any name `kzoo.layers.FeedForward` takes ("relu", "gelu", ...).
        dropout: float in [0, 1), on the concatenated window and after each
            hidden layer.
        dtype: None or a dtype policy for every layer but the float32 output.
        **kwargs: `keras.Model` arguments (`name`).

    Example:
    >>> model = FeedForwardLanguageModel(vocabulary_size=128, window_size=4, embedding_dim=16, hidden_dim=64)
    >>> tuple(model(keras.ops.ones((2, 10), "int32")).shape)
    (2, 10, 128)

    References:
        Bengio et al., "A Neural Probabilistic Language Model", JMLR 2003.
    """

    def __init__(
        self,
        vocabulary_size,
        window_size,
        embedding_dim,
        hidden_dim,
        num_layers=1,
        activation="tanh",
        dropout=0.0,
        dtype=None,
        **kwargs,
    ):
        check_positive_int("vocabulary_size", vocabulary_size)
        check_positive_int("window_size", window_size)
        check_positive_int("embedding_dim", embedding_dim)
        check_positive_int("hidden_dim", hidden_dim)
        check_positive_int("num_layers", num_layers)
        activation_fn = get_activation(activation)
        check_rate("dropout", dropout)

        # === Functional model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        x = keras.layers.Embedding(vocabulary_size, embedding_dim, mask_zero=True, dtype=dtype, name="token_embedding")(
            token_ids
        )  # (B, T, embedding_dim)
        x = ContextWindow(window_size, dtype=dtype, name="context_window")(x)  # (B, T, n * embedding_dim)
        x = keras.layers.Dropout(dropout, dtype=dtype, name="window_dropout")(x)
        for i in range(num_layers):
            x = keras.layers.Dense(hidden_dim, activation=activation_fn, dtype=dtype, name=f"hidden_{i}")(x)
            x = keras.layers.Dropout(dropout, dtype=dtype, name=f"hidden_{i}_dropout")(x)  # (B, T, hidden_dim)
        # A float32 layer: it casts the states up, so the logits (and the
        # softmax of the loss) are float32 under mixed precision.
        logits = keras.layers.Dense(vocabulary_size, dtype="float32", name="logits")(x)  # (B, T, V)
        super().__init__(inputs=token_ids, outputs=logits, dtype=dtype, **kwargs)

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.window_size = window_size
        self.embedding_dim = embedding_dim
        self.hidden_dim = hidden_dim
        self.num_layers = num_layers
        self.activation = activation
        self.dropout = dropout

    def default_metrics(self):
        return super().default_metrics() + [Perplexity()]

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "window_size": self.window_size,
                "embedding_dim": self.embedding_dim,
                "hidden_dim": self.hidden_dim,
                "num_layers": self.num_layers,
                "activation": self.activation,
                "dropout": self.dropout,
            }
        )
        return config
