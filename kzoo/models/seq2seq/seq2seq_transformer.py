import keras
import numpy as np
from keras import ops

from kzoo.models import generation
from kzoo.models.perplexity import Perplexity
from kzoo.models.seq2seq.seq2seq_backbone import Seq2SeqBackbone
from kzoo.models.task import Task
from kzoo.models.tied_logits import TiedLogits


@keras.saving.register_keras_serializable(package="kzoo")
class Seq2SeqTransformer(Task):
    """The Transformer for sequence-to-sequence tasks: a `Seq2SeqBackbone` and its output projection.

    Predicts each next target token from the source and the target prefix:
    P(y_{t+1} | y_<=t, x) = softmax(W h_t), with h_t the decoder's top hidden
    state. With the backbone's `tie_embeddings=True` (the paper), W is the
    shared source/target embedding table; otherwise it is a matrix of its
    own. Neither has a bias. Logits are float32 under any dtype policy.

    Training (teacher forcing): `x = {"encoder_token_ids": source,
    "decoder_token_ids": [BOS] + target}`, `y = target + [EOS]`, and the
    padding mask of `y` as `sample_weight`; id 0 is padding. `compile()`
    defaults add `Perplexity` to the accuracy.

    Incremental decoding, for generation: `encode(encoder_token_ids)` runs
    the encoder once; `empty_cache(batch_size, max_length)` gives a zero
    self-attention cache; `call_decoder_with_cache(...)` runs target tokens
    at positions `[cache_index, cache_index + T)` against the caches. Its
    first call (the prefill) computes the cross-attention keys/values of the
    encoder output once and returns them for the later one-token steps. This
    gives the same logits as the teacher-forced `__call__`.

    Args:
        backbone: a `Seq2SeqBackbone`.
        **kwargs: `keras.Model` arguments (`name`).

    Example:
    >>> model = Seq2SeqTransformer.from_preset("transformer_tiny")
    >>> ids = keras.ops.ones((2, 10), "int32")
    >>> model({"encoder_token_ids": ids, "decoder_token_ids": ids[:, :7]}).shape
    (2, 7, 1000)

    References:
        Vaswani et al., "Attention Is All You Need", 2017.
    """

    backbone_cls = Seq2SeqBackbone

    def __init__(self, backbone, **kwargs):
        # === Layers ===
        self.backbone = backbone
        if backbone.tie_embeddings:
            self.lm_head = TiedLogits(backbone.decoder_embedding, dtype=backbone.dtype_policy, name="lm_head")
        else:
            # A float32 layer: it casts the hidden states up, so the logits
            # (and the softmax of the loss) are float32 under mixed precision.
            self.lm_head = keras.layers.Dense(backbone.vocabulary_size, use_bias=False, dtype="float32", name="lm_head")

        # === Functional model ===
        inputs = backbone.input
        decoder_output = backbone(inputs)["decoder_sequence_output"]
        logits = self.lm_head(decoder_output)  # (B, T, V) float32
        super().__init__(inputs=inputs, outputs=logits, **kwargs)

    def default_metrics(self):
        return super().default_metrics() + [Perplexity()]

    def encode(self, encoder_token_ids):
        """Runs the encoder once: returns `(encoder_output (B, S, d), encoder_padding_mask (B, S))`."""
        return self.backbone.encode(encoder_token_ids)

    def empty_cache(self, batch_size, max_length):
        """A zero self-attention cache for `max_length` target positions: per
        decoder block a `(keys, values)` pair of `(B, h, max_length, d/h)`
        tensors (as `GPTCausalLM.empty_cache`: separate tensors let each step
        update them in place)."""
        return tuple(block.empty_cache(batch_size, max_length) for block in self.backbone.decoder_blocks)

    def call_decoder_with_cache(
        self,
        encoder_output,
        encoder_padding_mask,
        decoder_token_ids,
        self_attention_cache,
        cache_index,
        cross_attention_cache=None,
    ):
        """Runs target tokens `(B, T)` at positions `[cache_index, cache_index + T)`.

        Each decoder block writes the keys/values of the new tokens into its
        slice of `self_attention_cache` and attends over it (slots after the
        current position are masked causally) and over the encoder output
        through `cross_attention_cache`. Runs in inference mode (no dropout).

        Args:
            encoder_output: `(B, S, d)` from `encode`; only read when
                `cross_attention_cache` is None.
            encoder_padding_mask: bool `(B, S)` from `encode`.
            decoder_token_ids: int tensor `(B, T)`, T >= 1 (a prefix, then one
                token per step).
            self_attention_cache: from `empty_cache` or a previous call.
            cache_index: int or scalar int tensor, the position of
                `decoder_token_ids[:, 0]`.
            cross_attention_cache: None on the first call, which computes it
                (one `(keys, values)` pair of `(B, h, S, d/h)` tensors per
                block); afterwards the one that call returned.

        Returns:
            `(logits, hidden_states, self_attention_cache, cross_attention_cache)`:
            float32 logits `(B, T, V)`, the decoder's hidden states `(B, T, d)`
            and both caches, the self-attention one updated.
        """
        hidden_states, self_attention_cache, cross_attention_cache = self.backbone.decode(
            decoder_token_ids,
            encoder_output,
            encoder_padding_mask,
            self_attention_cache=self_attention_cache,
            cache_index=cache_index,
            cross_attention_cache=cross_attention_cache,
        )
        return self.lm_head(hidden_states), hidden_states, self_attention_cache, cross_attention_cache

    def generate(
        self,
        encoder_token_ids,
        start_token_id,
        max_length=None,
        max_new_tokens=None,
        sampler="greedy",
        stop_token_ids=None,
        decoder_prompts=None,
        jit_compile=True,
    ):
        """Translates / summarizes: decodes a target for each source sequence.

        The encoder runs once; its cross-attention keys/values are computed
        in the prefill and reused by every step, and the decoder's own
        keys/values go to the KV cache. The whole loop is one compiled
        function per (batch size, source length, target length), reused by
        later calls. Samplers, stop tokens and ragged decoder prompts work as
        in `GPTCausalLM.generate`.

        Args:
            encoder_token_ids: a list of source id lists (ragged, padded here
                with 0) or a 2-D int array with 0 as padding.
            start_token_id: the id each target starts with (e.g. [BOS]).
            max_length: total target length, start token included; defaults
                to the backbone's `max_sequence_length`.
            max_new_tokens: alternatively, how many tokens to add.
            sampler: a sampler name or `kzoo.samplers.Sampler`.
            stop_token_ids: ids that end a row (e.g. [EOS]).
            decoder_prompts: optional target prefixes (each starting with
                `start_token_id`); defaults to `[start_token_id]` per row.
            jit_compile: bool, compile the loop with XLA (TensorFlow).

        Returns:
            For a list of sources: a list of target id lists (start token
            first, up to and including a stop token). Otherwise a dict with
            "token_ids" `(B, max_length)` and "padding_mask".

        Example:
        >>> model = Seq2SeqTransformer.from_preset("transformer_tiny")
        >>> model.generate([[7, 8, 9], [4, 5]], start_token_id=5, max_new_tokens=6)
        """
        vocabulary_size = self.backbone.vocabulary_size
        generation.check_token_ids(encoder_token_ids, vocabulary_size, "encoder_token_ids")
        generation.check_token_ids([start_token_id], vocabulary_size, "start_token_id")
        ragged = isinstance(encoder_token_ids, (list, tuple))
        if ragged:
            longest = max((len(row) for row in encoder_token_ids), default=0)
            sources = np.zeros((len(encoder_token_ids), longest), "int32")
            for i, row in enumerate(encoder_token_ids):
                sources[i, : len(row)] = row
        else:
            sources = np.asarray(ops.convert_to_numpy(encoder_token_ids), "int32")
        if sources.ndim != 2 or sources.shape[1] == 0 or not (sources != 0).any(axis=1).all():
            raise ValueError(
                f"`encoder_token_ids` must hold at least one non-padding token per row; received shape {sources.shape}."
            )
        if sources.shape[1] > self.backbone.max_sequence_length:
            raise ValueError(
                f"The source length ({sources.shape[1]}) must be <= the model's maximum "
                f"sequence length ({self.backbone.max_sequence_length})."
            )
        if decoder_prompts is None:
            decoder_prompts = [[start_token_id]] * len(sources)
        if not ragged:
            decoder_prompts = np.asarray(decoder_prompts, "int32")

        def start(prompt_ids, length, sources):
            encoder_output, encoder_padding_mask = self.encode(sources)
            cache = self.empty_cache(ops.shape(prompt_ids)[0], length)
            logits, _, cache, cross_cache = self.call_decoder_with_cache(
                encoder_output, encoder_padding_mask, prompt_ids, cache, 0
            )

            # The source mask travels with the caches: beam search repeats
            # every row of the loop state, the mask's too.
            def step(token, state, index):
                cache, cross_cache, encoder_padding_mask = state
                logits, _, cache, cross_cache = self.call_decoder_with_cache(
                    None, encoder_padding_mask, token, cache, index, cross_cache
                )
                return logits[:, -1], (cache, cross_cache, encoder_padding_mask)

            return logits[:, -1], (cache, cross_cache, encoder_padding_mask), step

        return generation.generate(
            self,
            start,
            decoder_prompts,
            max_length=max_length,
            max_new_tokens=max_new_tokens,
            sampler=sampler,
            stop_token_ids=stop_token_ids,
            jit_compile=jit_compile,
            limit=self.backbone.max_sequence_length,
            inputs=(sources,),
        )
