import keras

from kzoo.checkpoints.keras_hub import copy_weights
from kzoo.checkpoints.keras_hub import keras_hub_config
from kzoo.checkpoints.keras_hub import transformer_block_pairs
from kzoo.layers import LayerNormalization
from kzoo.layers import TokenAndPositionEmbedding
from kzoo.layers import TransformerEncoderBlock
from kzoo.models.backbone import Backbone
from kzoo.validation import check_divisible
from kzoo.validation import check_positive_int
from kzoo.validation import check_rate

# BERT's LayerNorm epsilon, kept so that converted checkpoints match exactly.
BERT_LAYER_NORM_EPSILON = 1e-12
# The original BERT code (and keras-hub's checkpoints) use the tanh GELU.
BERT_ACTIVATION = "gelu_approximate"


def bert_kernel_initializer():
    """BERT initializes every weight matrix from a truncated N(0, 0.02^2)."""
    return keras.initializers.TruncatedNormal(stddev=0.02)


@keras.saving.register_keras_serializable(package="kzoo")
class BertBackbone(Backbone):
    """A BERT encoder: bidirectional post-LN transformer with a [CLS] pooler.

    Each token's input is the sum of its token, segment (sentence A/B) and
    learned position embeddings, normalized and dropped out; `num_layers`
    post-LN encoder blocks follow:

        h_0 = Dropout(LayerNorm(W_e[x] + W_s[s] + W_p))
        h_l = TransformerEncoderBlock(h_{l-1})     (post-LN, GELU)
        pooled = tanh(W h_L[:, 0] + b)             (the [CLS] position)

    Padding: `padding_mask` (1 = real token) removes padded tokens from every
    attention, so the outputs at real tokens do not depend on how much
    padding follows. Outputs at padded positions carry no meaning.

    Inputs: `{"token_ids", "segment_ids", "padding_mask"}`, each `(B, T)` int
    with T <= `max_sequence_length`. Outputs: `{"sequence_output": (B, T, d),
    "pooled_output": (B, d)}`.

    Args:
        vocabulary_size: int, number of token ids V.
        num_layers: int, number of encoder blocks L.
        num_heads: int, attention heads per block; must divide `hidden_dim`.
        hidden_dim: int, model width d.
        intermediate_dim: int, feed-forward hidden width (4d in BERT).
        max_sequence_length: int, the number of learned positions.
        num_segments: int, the number of segment ids.
        dropout: float in [0, 1), on the embeddings, attention weights and
            residual branches.
        activation: the feed-forward activation: "gelu_approximate" (the tanh
            GELU of the original BERT code and keras-hub), "gelu" (the exact
            one, as Hugging Face's BERT checkpoints run) or any name
            `kzoo.layers.FeedForward` takes.
        layer_norm_epsilon: float, the epsilon of every LayerNorm.
        dtype: None or a dtype policy for every layer (e.g. "mixed_bfloat16").
        **kwargs: `keras.Model` arguments (`name`, `trainable`).

    Example:
    >>> backbone = BertBackbone(
    ...     vocabulary_size=1000, num_layers=2, num_heads=2, hidden_dim=64,
    ...     intermediate_dim=256,
    ... )
    >>> ids = keras.ops.ones((2, 16), "int32")
    >>> outputs = backbone({"token_ids": ids, "segment_ids": 0 * ids, "padding_mask": ids})
    >>> tuple(outputs["pooled_output"].shape)
    (2, 64)

    References:
        Devlin et al., "BERT: Pre-training of Deep Bidirectional
        Transformers for Language Understanding", 2019.
    """

    keras_hub_class_name = "BertBackbone"

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        max_sequence_length=512,
        num_segments=2,
        dropout=0.1,
        activation=BERT_ACTIVATION,
        layer_norm_epsilon=BERT_LAYER_NORM_EPSILON,
        dtype=None,
        **kwargs,
    ):
        check_positive_int("vocabulary_size", vocabulary_size)
        check_positive_int("num_layers", num_layers)
        check_positive_int("num_heads", num_heads)
        check_positive_int("hidden_dim", hidden_dim)
        check_positive_int("intermediate_dim", intermediate_dim)
        check_positive_int("max_sequence_length", max_sequence_length)
        check_positive_int("num_segments", num_segments)
        check_rate("dropout", dropout)
        check_divisible("hidden_dim", hidden_dim, "num_heads", num_heads)

        # === Layers ===
        self.embedding = TokenAndPositionEmbedding(
            vocabulary_size,
            max_sequence_length,
            hidden_dim,
            position="learned",
            embeddings_initializer=bert_kernel_initializer(),
            dtype=dtype,
            name="embedding",
        )
        self.segment_embedding = keras.layers.Embedding(
            num_segments,
            hidden_dim,
            embeddings_initializer=bert_kernel_initializer(),
            dtype=dtype,
            name="segment_embedding",
        )
        self.embedding_norm = LayerNormalization(epsilon=layer_norm_epsilon, dtype=dtype, name="embedding_norm")
        self.embedding_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="embedding_dropout")
        self.transformer_blocks = [
            TransformerEncoderBlock(
                num_heads,
                intermediate_dim,
                dropout=dropout,
                activation=activation,
                layer_norm_epsilon=layer_norm_epsilon,
                kernel_initializer=bert_kernel_initializer(),
                dtype=dtype,
                name=f"transformer_block_{i}",
            )
            for i in range(num_layers)
        ]
        self.pooler = keras.layers.Dense(
            hidden_dim,
            activation="tanh",
            kernel_initializer=bert_kernel_initializer(),
            dtype=dtype,
            name="pooler",
        )

        # === Functional model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        segment_ids = keras.Input(shape=(None,), dtype="int32", name="segment_ids")
        padding_mask = keras.Input(shape=(None,), dtype="int32", name="padding_mask")
        x = self.embedding(token_ids) + self.segment_embedding(segment_ids)  # (B, T, d)
        x = self.embedding_dropout(self.embedding_norm(x))
        for block in self.transformer_blocks:
            x = block(x, padding_mask=padding_mask)
        pooled_output = self.pooler(x[:, 0, :])  # (B, d), from [CLS]
        super().__init__(
            inputs={"token_ids": token_ids, "segment_ids": segment_ids, "padding_mask": padding_mask},
            outputs={"sequence_output": x, "pooled_output": pooled_output},
            dtype=dtype,
            **kwargs,
        )

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.max_sequence_length = max_sequence_length
        self.num_segments = num_segments
        self.dropout = dropout
        self.activation = activation
        self.layer_norm_epsilon = layer_norm_epsilon

    def get_config(self):
        config = super().get_config()
        config.update(
            vocabulary_size=self.vocabulary_size,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            hidden_dim=self.hidden_dim,
            intermediate_dim=self.intermediate_dim,
            max_sequence_length=self.max_sequence_length,
            num_segments=self.num_segments,
            dropout=self.dropout,
            activation=self.activation,
            layer_norm_epsilon=self.layer_norm_epsilon,
        )
        return config

    @classmethod
    def from_keras_hub(cls, hub_backbone, **kwargs):
        """Converts a `keras_hub.models.BertBackbone`, weights included;
        `kwargs` override its config (e.g. `dropout`, `dtype`)."""
        config = keras_hub_config(
            hub_backbone,
            (
                "vocabulary_size",
                "num_layers",
                "num_heads",
                "hidden_dim",
                "intermediate_dim",
                "max_sequence_length",
                "num_segments",
                "dropout",
            ),
        )
        backbone = cls(**{**config, **kwargs})
        pairs = [
            (backbone.embedding.token_embedding, hub_backbone.token_embedding),
            (backbone.embedding.position_embedding, hub_backbone.position_embedding),
            (backbone.segment_embedding, hub_backbone.segment_embedding),
            (backbone.embedding_norm, hub_backbone.embeddings_layer_norm),
            (backbone.pooler, hub_backbone.pooled_dense),
        ]
        for block, hub_layer in zip(backbone.transformer_blocks, hub_backbone.transformer_layers):
            pairs += transformer_block_pairs(block, hub_layer)
        copy_weights(pairs)
        return backbone
