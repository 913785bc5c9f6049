import keras
from keras import ops

from kzoo.layers import TokenAndPositionEmbedding
from kzoo.layers import TransformerDecoderBlock
from kzoo.layers import TransformerEncoderBlock
from kzoo.models.backbone import Backbone
from kzoo.validation import check_divisible
from kzoo.validation import check_positive_int
from kzoo.validation import check_rate

# Token id 0 is padding on both sides (kzoo's tokenizers reserve it as `[PAD]`).
PAD_ID = 0


@keras.saving.register_keras_serializable(package="kzoo")
class Seq2SeqBackbone(Backbone):
    """The encoder-decoder Transformer of "Attention Is All You Need", without the output layer.

    Source and target tokens are embedded, scaled by sqrt(d_model) and summed
    with the sinusoidal position encoding (sec. 3.4-3.5), then pass through
    post-LN stacks with ReLU feed-forward networks (sec. 3.1):

        x_0 = Dropout(sqrt(d) E_src[x] + PE)
        x_l = TransformerEncoderBlock(x_{l-1})               (l = 1..N_enc)
        y_0 = Dropout(sqrt(d) E_tgt[y] + PE)
        y_l = TransformerDecoderBlock(y_{l-1}, x_{N_enc})    (causal, cross-attention)

    With `tie_embeddings=True` (the paper's setting, sec. 3.4) source and
    target share one table E, which `Seq2SeqTransformer` also uses as the
    pre-softmax projection; this needs a joint source/target vocabulary
    (e.g. the paper's shared 37000-token BPE for English-German).

    Padding: id 0 is padding in both inputs. Padded encoder positions are
    hidden from every encoder self-attention and every cross-attention, and
    the decoder is causal, so the outputs at real tokens do not depend on how
    much padding follows. Outputs at padded positions carry no meaning;
    losses must weight them 0.

    Inputs: `{"encoder_token_ids": (B, S) int, "decoder_token_ids": (B, T) int}`,
    S, T <= `max_sequence_length`. Outputs: `{"encoder_sequence_output":
    (B, S, d), "decoder_sequence_output": (B, T, d)}`.

    `encode` and `decode` run the two halves on their own (the functional
    model is built from them); `decode` also runs incrementally against
    key/value caches, which `Seq2SeqTransformer.call_decoder_with_cache` uses.

    Args:
        vocabulary_size: int, number of token ids V (shared by source and
            target).
        num_encoder_layers: int, encoder blocks N_enc.
        num_decoder_layers: int, decoder blocks N_dec.
        num_heads: int, attention heads h; must divide `hidden_dim`.
        hidden_dim: int, model width d_model.
        intermediate_dim: int, feed-forward hidden width d_ff.
        max_sequence_length: int, the longest source or target sequence.
        dropout: float in [0, 1), P_drop: on the embedding sums, attention
            weights and residual branches.
        tie_embeddings: bool, one table for source, target and output
            projection (True) or a table each.
        layer_norm_epsilon: float, epsilon of every LayerNorm.
        dtype: None or a dtype policy for every layer (e.g. "mixed_bfloat16").
        **kwargs: `keras.Model` arguments (`name`, `trainable`).

    Example:
    >>> backbone = Seq2SeqBackbone(
    ...     vocabulary_size=1000, num_encoder_layers=2, num_decoder_layers=2,
    ...     num_heads=4, hidden_dim=64, intermediate_dim=256, max_sequence_length=64,
    ... )
    >>> outputs = backbone({"encoder_token_ids": keras.ops.ones((2, 12), "int32"),
    ...                     "decoder_token_ids": keras.ops.ones((2, 9), "int32")})
    >>> tuple(outputs["decoder_sequence_output"].shape)
    (2, 9, 64)

    References:
        Vaswani et al., "Attention Is All You Need", 2017.
    """

    def __init__(
        self,
        vocabulary_size,
        num_encoder_layers,
        num_decoder_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        max_sequence_length,
        dropout=0.1,
        tie_embeddings=True,
        layer_norm_epsilon=1e-5,
        dtype=None,
        **kwargs,
    ):
        check_positive_int("vocabulary_size", vocabulary_size)
        check_positive_int("num_encoder_layers", num_encoder_layers)
        check_positive_int("num_decoder_layers", num_decoder_layers)
        check_positive_int("num_heads", num_heads)
        check_positive_int("hidden_dim", hidden_dim)
        check_positive_int("intermediate_dim", intermediate_dim)
        check_positive_int("max_sequence_length", max_sequence_length)
        check_rate("dropout", dropout)
        check_divisible("hidden_dim", hidden_dim, "num_heads", num_heads)
        if not isinstance(tie_embeddings, bool):
            raise ValueError(f"`tie_embeddings` must be a bool; received tie_embeddings={tie_embeddings!r}.")

        # === Layers ===
        def embedding(name):
            return TokenAndPositionEmbedding(
                vocabulary_size,
                max_sequence_length,
                hidden_dim,
                position="sinusoidal",
                scale_embeddings=True,
                # N(0, 1/d): after the sqrt(d) scaling the token vectors have
                # unit variance like the position encoding, and as the tied
                # output projection they give logits of unit scale (as in
                # tensor2tensor and fairseq).
                embeddings_initializer=keras.initializers.RandomNormal(stddev=hidden_dim**-0.5),
                dtype=dtype,
                name=name,
            )

        if tie_embeddings:
            self.encoder_embedding = self.decoder_embedding = embedding("token_embedding")
        else:
            self.encoder_embedding = embedding("encoder_embedding")
            self.decoder_embedding = embedding("decoder_embedding")
        self.encoder_embedding_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="encoder_embedding_dropout")
        self.decoder_embedding_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="decoder_embedding_dropout")
        block_args = dict(
            num_heads=num_heads,
            intermediate_dim=intermediate_dim,
            dropout=dropout,
            activation="relu",
            norm_first=False,
            layer_norm_epsilon=layer_norm_epsilon,
            dtype=dtype,
        )
        self.encoder_blocks = [
            TransformerEncoderBlock(**block_args, name=f"encoder_block_{i}") for i in range(num_encoder_layers)
        ]
        self.decoder_blocks = [
            TransformerDecoderBlock(**block_args, cross_attention=True, name=f"decoder_block_{i}")
            for i in range(num_decoder_layers)
        ]

        # === Functional model ===
        encoder_token_ids = keras.Input(shape=(None,), dtype="int32", name="encoder_token_ids")
        decoder_token_ids = keras.Input(shape=(None,), dtype="int32", name="decoder_token_ids")
        encoder_output, encoder_padding_mask = self.encode(encoder_token_ids)
        decoder_output = self.decode(decoder_token_ids, encoder_output, encoder_padding_mask)
        super().__init__(
            inputs={"encoder_token_ids": encoder_token_ids, "decoder_token_ids": decoder_token_ids},
            outputs={"encoder_sequence_output": encoder_output, "decoder_sequence_output": decoder_output},
            dtype=dtype,
            **kwargs,
        )

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.num_encoder_layers = num_encoder_layers
        self.num_decoder_layers = num_decoder_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.max_sequence_length = max_sequence_length
        self.dropout = dropout
        self.tie_embeddings = tie_embeddings
        self.layer_norm_epsilon = layer_norm_epsilon

    def encode(self, encoder_token_ids):
        """Runs the encoder: `(B, S)` ids -> `(encoder_output (B, S, d), padding_mask (B, S))`."""
        padding_mask = ops.not_equal(encoder_token_ids, PAD_ID)
        x = self.encoder_embedding_dropout(self.encoder_embedding(encoder_token_ids))  # (B, S, d)
        for block in self.encoder_blocks:
            x = block(x, padding_mask=padding_mask)
        return x, padding_mask

    def decode(
        self,
        decoder_token_ids,
        encoder_output,
        encoder_padding_mask,
        self_attention_cache=None,
        cache_index=0,
        cross_attention_cache=None,
    ):
        """Runs the decoder on `(B, T)` ids attending to the encoder output.

        Without `self_attention_cache`, returns the hidden states `(B, T, d)`
        of the whole (teacher-forced) target. With it, `decoder_token_ids`
        sit at positions `[cache_index, cache_index + T)` and the call returns
        `(hidden_states, self_attention_cache, cross_attention_cache)`; when
        `cross_attention_cache` is None it is computed here from
        `encoder_output` (pass it back on later calls; `encoder_output` is then
        unused).

        Args:
            decoder_token_ids: int tensor `(B, T)`.
            encoder_output: `(B, S, d)` from `encode`, or None with a
                `cross_attention_cache`.
            encoder_padding_mask: bool `(B, S)` from `encode`.
            self_attention_cache: None or a tuple with one `(keys, values)`
                pair per decoder block, each `(B, h, max_length, d/h)`.
            cache_index: int or scalar int tensor, position of the first token.
            cross_attention_cache: None or a tuple with one `(keys, values)`
                pair per decoder block, each `(B, h, S, d/h)`.
        """
        padding_mask = ops.not_equal(decoder_token_ids, PAD_ID)
        x = self.decoder_embedding(decoder_token_ids, start_index=cache_index)
        x = self.decoder_embedding_dropout(x)  # (B, T, d)
        if self_attention_cache is None:
            for block in self.decoder_blocks:
                x = block(x, encoder_output, padding_mask=padding_mask, encoder_padding_mask=encoder_padding_mask)
            return x
        self_attention_caches, cross_attention_caches = [], []
        for i, block in enumerate(self.decoder_blocks):
            x, self_cache, cross_cache = block(
                x,
                encoder_output,
                padding_mask=padding_mask,
                encoder_padding_mask=encoder_padding_mask,
                self_attention_cache=self_attention_cache[i],
                self_attention_cache_index=cache_index,
                cross_attention_cache=None if cross_attention_cache is None else cross_attention_cache[i],
            )
            self_attention_caches.append(self_cache)
            cross_attention_caches.append(cross_cache)
        return x, tuple(self_attention_caches), tuple(cross_attention_caches)

    def get_config(self):
        config = super().get_config()
        config.update(
            vocabulary_size=self.vocabulary_size,
            num_encoder_layers=self.num_encoder_layers,
            num_decoder_layers=self.num_decoder_layers,
            num_heads=self.num_heads,
            hidden_dim=self.hidden_dim,
            intermediate_dim=self.intermediate_dim,
            max_sequence_length=self.max_sequence_length,
            dropout=self.dropout,
            tie_embeddings=self.tie_embeddings,
            layer_norm_epsilon=self.layer_norm_epsilon,
        )
        return config
