import keras

from kzoo.checkpoints.keras_hub import copy_weights
from kzoo.checkpoints.keras_hub import keras_hub_config
from kzoo.checkpoints.keras_hub import transformer_block_pairs
from kzoo.models.backbone import Backbone
from kzoo.models.decoder.decoder_backbone import DecoderBackbone


@keras.saving.register_keras_serializable(package="kzoo")
class GPTBackbone(DecoderBackbone):
    """A GPT-2 style decoder-only transformer, without the language-model head.

    The `DecoderBackbone` with GPT-2's settings and GPT-2's arguments. Token
    ids and learned positions are embedded and summed, then pass
    through `num_layers` pre-LN causal self-attention blocks and a final
    LayerNorm:

        h_0 = W_e[x] + W_p
        h_l = TransformerDecoderBlock(h_{l-1})    (causal, pre-LN, tanh-GELU)
        output = LayerNorm(h_L)

    Position t attends to positions <= t only, so its output does not depend
    on later tokens. Padding: `padding_mask` (1 = real token) keeps padded
    keys out of every attention; padded positions themselves get outputs
    that carry no meaning (kzoo gives them zero attention, keras-hub attends
    from them), so losses must weight them 0.

    Inputs: `{"token_ids": (B, T) int, "padding_mask": (B, T) int}`, with
    T <= `max_sequence_length`. Output: the hidden states `(B, T, hidden_dim)`.

    Args:
        vocabulary_size: int, number of token ids V.
        num_layers: int, number of transformer blocks L.
        num_heads: int, attention heads per block; must divide `hidden_dim`.
        hidden_dim: int, model width d.
        intermediate_dim: int, feed-forward hidden width (4d in GPT-2).
        max_sequence_length: int, the number of learned positions.
        dropout: float in [0, 1), on the embeddings, attention weights and
            residual branches.
        layer_norm_epsilon: float, epsilon of every LayerNorm.
        activation: the feed-forward activation: "gelu_approximate" (GPT-2's
            tanh GELU) or any name `kzoo.layers.FeedForward` takes.
        dtype: None or a dtype policy for every layer (e.g. "mixed_bfloat16").
        **kwargs: `keras.Model` arguments (`name`, `trainable`).

    Example:
    >>> backbone = GPTBackbone(
    ...     vocabulary_size=1000, num_layers=2, num_heads=2, hidden_dim=64,
    ...     intermediate_dim=256, max_sequence_length=128,
    ... )
    >>> tuple(backbone({"token_ids": keras.ops.ones((2, 16), "int32"),
    ...                 "padding_mask": keras.ops.ones((2, 16), "int32")}).shape)
    (2, 16, 64)

    References:
        Radford et al., "Language Models are Unsupervised Multitask
        Learners", 2019 (GPT-2).
    """

    keras_hub_class_name = "GPT2Backbone"
    # As GPTBackbone named it before it was a DecoderBackbone (its optimizer slots carry the name).
    final_norm_name = "layer_norm"

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        max_sequence_length,
        dropout=0.1,
        layer_norm_epsilon=1e-5,
        activation="gelu_approximate",
        dtype=None,
        **kwargs,
    ):
        super().__init__(
            vocabulary_size,
            num_layers,
            num_heads,
            hidden_dim,
            intermediate_dim,
            max_sequence_length,
            positions="learned",
            normalization="layer_norm",
            norm_epsilon=layer_norm_epsilon,
            feed_forward="plain",
            activation=activation,
            attention_bias=True,
            feed_forward_bias=True,
            dropout=dropout,
            model_type="gpt2",
            dtype=dtype,
            **kwargs,
        )
        self.layer_norm_epsilon = layer_norm_epsilon

    def get_config(self):
        config = Backbone.get_config(self)
        config.update(
            vocabulary_size=self.vocabulary_size,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            hidden_dim=self.hidden_dim,
            intermediate_dim=self.intermediate_dim,
            max_sequence_length=self.max_sequence_length,
            dropout=self.dropout,
            layer_norm_epsilon=self.layer_norm_epsilon,
            activation=self.activation,
        )
        return config

    @classmethod
    def from_keras_hub(cls, hub_backbone, **kwargs):
        """Converts a `keras_hub.models.GPT2Backbone`, weights included;
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
                "dropout",
            ),
        )
        backbone = cls(**{**config, **kwargs})
        pairs = [
            (backbone.embedding.token_embedding, hub_backbone.token_embedding),
            (backbone.embedding.position_embedding, hub_backbone.position_embedding),
            (backbone.final_norm, hub_backbone.layer_norm),
        ]
        for block, hub_layer in zip(backbone.transformer_blocks, hub_backbone.transformer_layers):
            pairs += transformer_block_pairs(block, hub_layer)
        copy_weights(pairs)
        return backbone
