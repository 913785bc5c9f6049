"""The embedding and recurrent layers shared by kzoo's RNN baselines."""

import keras

from kzoo.validation import check_choice
from kzoo.validation import check_positive_int
from kzoo.validation import check_rate

RECURRENT_LAYERS = {"lstm": keras.layers.LSTM, "gru": keras.layers.GRU, "rnn": keras.layers.SimpleRNN}


def recurrent_stack(
    token_ids,
    vocabulary_size,
    embedding_dim,
    hidden_dim,
    num_layers,
    cell="lstm",
    bidirectional=False,
    dropout=0.0,
    dtype=None,
):
    """Embeds `token_ids` and runs them through stacked recurrent layers.

        h_0 = Dropout(E[x])
        h_l = Dropout(RNN_l(h_{l-1}))    (l = 1..num_layers)

    Dropout acts between layers, on the non-recurrent connections only
    (Zaremba et al., 2014), which also keeps the fast cuDNN kernels usable.
    Id 0 is padding: the embedding emits a Keras mask that every recurrent
    layer uses to skip padded steps (the backward direction of a
    bidirectional layer starts at the last real token) and that the returned
    tensor still carries.

    Args:
        token_ids: symbolic int tensor `(B, T)` (a `keras.Input`).
        vocabulary_size: int, number of token ids V.
        embedding_dim: int, width of the token vectors.
        hidden_dim: int, units of each recurrent layer (per direction).
        num_layers: int, number of stacked recurrent layers.
        cell: "lstm", "gru" or "rnn" (Elman's tanh RNN, `SimpleRNN`).
        bidirectional: bool, run each layer in both directions and
            concatenate (output width `2 * hidden_dim`).
        dropout: float in [0, 1).
        dtype: None or a dtype policy for every layer.

    Returns:
        The top layer's states `(B, T, hidden_dim or 2 * hidden_dim)`.
    """
    check_positive_int("vocabulary_size", vocabulary_size)
    check_positive_int("embedding_dim", embedding_dim)
    check_positive_int("hidden_dim", hidden_dim)
    check_positive_int("num_layers", num_layers)
    check_choice("cell", cell, RECURRENT_LAYERS)
    check_rate("dropout", dropout)

    x = keras.layers.Embedding(vocabulary_size, embedding_dim, mask_zero=True, dtype=dtype, name="token_embedding")(
        token_ids
    )
    x = keras.layers.Dropout(dropout, dtype=dtype, name="embedding_dropout")(x)  # (B, T, embedding_dim)
    for i in range(num_layers):
        layer = RECURRENT_LAYERS[cell](hidden_dim, return_sequences=True, dtype=dtype, name=f"{cell}_{i}")
        if bidirectional:
            layer = keras.layers.Bidirectional(layer, dtype=dtype, name=f"bidirectional_{cell}_{i}")
        x = keras.layers.Dropout(dropout, dtype=dtype, name=f"{cell}_{i}_dropout")(layer(x))
    return x
