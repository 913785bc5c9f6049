import keras
from keras import ops


@keras.saving.register_keras_serializable(package="kzoo")
class TiedLogits(keras.layers.Layer):
    """Output logits tied to the token embedding: logits = h E^T (+ b).

    Weight tying (Press & Wolf, 2017) reuses the input table E `(V, d)` as
    the output projection, so P(w | h) = softmax(E h + b): the score of a
    token is the dot product of its embedding with the hidden state. This
    layer owns no copy of E; it reads the embedding's table at each call
    (with its LoRA update; a quantized table through the embedding's own
    call), so gradients from both uses reach the one table.

    The product runs in the compute dtype and the logits are returned in
    float32 (also under mixed precision) so that the softmax and the loss
    are computed at full precision. The optional bias is kept in float32.

    Args:
        embedding: the layer holding the table: a `keras.layers.Embedding`
            or a `kzoo.layers.TokenAndPositionEmbedding` (its
            `token_embedding`).
        use_bias: bool, whether to add a per-token output bias b `(V,)`
            (BERT's masked-LM head has one, GPT-2 has none).
        **kwargs: base layer arguments.

    Example:
    >>> embedding = keras.layers.Embedding(100, 8)
    >>> hidden = embedding(keras.ops.array([[1, 2, 3]]))
    >>> tuple(TiedLogits(embedding)(hidden).shape)
    (1, 3, 100)

    References:
        Press & Wolf, "Using the Output Embedding to Improve Language
        Models", 2017.
    """

    def __init__(self, embedding, use_bias=False, **kwargs):
        # Variables are cast by hand: the bias must stay float32.
        super().__init__(autocast=False, **kwargs)
        self.embedding = embedding
        self.use_bias = use_bias

    def build(self, inputs_shape):
        if self.use_bias:
            self.bias = self.add_weight(
                name="bias",
                shape=(self.embedding.embeddings.shape[0],),
                initializer="zeros",
                dtype="float32",
            )
        self.built = True

    def _table(self):
        """The token table `(V, d)` as the embedding layer uses it: with its LoRA update, dequantized."""
        layer = getattr(self.embedding, "token_embedding", self.embedding)
        if layer.quantization_mode is None:
            return layer.embeddings  # LoRA included
        # A quantized table is stored in another form; the layer's own call reads it back.
        return layer(ops.arange(layer.input_dim, dtype="int32"))

    def call(self, hidden):
        table = ops.cast(self._table(), self.compute_dtype)  # (V, d)
        if all(size == 1 for size in hidden.shape[:-1]):
            # One row (a batch-1 decoding step): E h reads the table in its
            # stored (V, d) layout, where h E^T makes XLA:CPU copy the whole
            # table transposed on every step.
            logits = ops.reshape(ops.matmul(table, ops.reshape(hidden, (-1, 1))), (*hidden.shape[:-1], -1))
        else:
            logits = ops.matmul(hidden, ops.transpose(table))  # (..., V)
        logits = ops.cast(logits, "float32")
        if self.use_bias:
            logits = logits + self.bias
        return logits

    def compute_output_spec(self, hidden):
        shape = (*hidden.shape[:-1], self.embedding.embeddings.shape[0])
        return keras.KerasTensor(shape, dtype="float32")

    def get_config(self):
        config = super().get_config()
        config.update(embedding=keras.layers.serialize(self.embedding), use_bias=self.use_bias)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["embedding"] = keras.layers.deserialize(config["embedding"])
        return cls(**config)
