import keras
import numpy as np
from keras import ops

from kzoo.models import generation
from kzoo.models.perplexity import Perplexity
from kzoo.models.seq2seq.seq2seq_backbone import PAD_ID
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

    Incremental decoding (the serving interface that `generate`, the
    SavedModel and TFLite files all run): `prefill(token_ids, cache_length,
    encoder_token_ids)` encodes the source once and runs a target prompt into
    the caches, `decode(token_ids, state, index)` runs more target tokens.
    This gives the same logits as the teacher-forced `__call__`.

    Args:
        backbone: a `Seq2SeqBackbone`.
        **kwargs: `keras.Model` arguments (`name`).

    Example:
    >>> model = Seq2SeqTransformer.from_preset("transformer_tiny")
    >>> ids = keras.ops.ones((2, 10), "int32")
    >>> tuple(model({"encoder_token_ids": ids, "decoder_token_ids": ids[:, :7]}).shape)
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

    def prefill(self, token_ids, cache_length, encoder_token_ids, last_only=False):
        """The serving interface's first half: encodes the source and runs the target prompt.

        The encoder runs once; the cross-attention keys and values of its
        output are computed here once and kept in the state for every step.

        Args:
            token_ids: int tensor `(B, T)`, the target prompt (e.g. `[BOS]`),
                1 <= T <= `cache_length`.
            cache_length: int, the target positions of the self-attention cache.
            encoder_token_ids: int tensor `(B, S)`, the source; id 0 is padding.
            last_only: bool, the logits of the last position alone `(B, 1, V)`.

        Returns:
            `(logits, state)`: float32 logits `(B, T, V)` and the state for
            `decode`, a dict: per decoder block `key_cache_<i>` and
            `value_cache_<i>` `(B, h, cache_length, d/h)` (updated by each
            step) and `cross_key_cache_<i>` and `cross_value_cache_<i>`
            `(B, h, S, d/h)`, plus `encoder_padding_mask` int32 `(B, S)`
            (these three read only). The names are those of the exported
            files' state inputs and outputs.
        """
        encoder_output, encoder_padding_mask = self.backbone.encode(encoder_token_ids)
        batch_size = ops.shape(token_ids)[0]
        caches = [block.empty_cache(batch_size, cache_length) for block in self.backbone.decoder_blocks]
        hidden_states, caches, cross_caches = self.backbone.decode(
            token_ids, encoder_output, encoder_padding_mask, self_attention_cache=caches, cache_index=0
        )
        state = {
            **generation.cache_state(caches),
            **generation.cache_state(cross_caches, prefix="cross_"),
            "encoder_padding_mask": ops.cast(encoder_padding_mask, "int32"),
        }
        if last_only:
            hidden_states = hidden_states[:, -1:]
        return self.lm_head(hidden_states), state

    def decode(self, token_ids, state, index, last_only=False):
        """The serving interface's step: runs target tokens `(B, T)` at positions `[index, index + T)`.

        Each decoder block writes the keys and values of the new tokens into
        the state and attends over it (slots after the current position are
        masked causally) and over the source through the cross-attention
        caches. Runs in inference mode (no dropout). A prefill followed by
        steps gives the logits of the teacher-forced `__call__`.

        Args:
            token_ids: int tensor `(B, T)`, T >= 1.
            state: the dict from `prefill` or from the previous `decode`.
            index: int or scalar int tensor, the position of `token_ids[:, 0]`.
            last_only: bool, the logits of the last position alone `(B, 1, V)`.

        Returns:
            `(logits (B, T, V) float32, state)`; the entries a step only reads
            are passed on as they came.

        Example:
        >>> model = Seq2SeqTransformer.from_preset("transformer_tiny")
        >>> source, start = keras.ops.ones((1, 6), "int32"), keras.ops.ones((1, 1), "int32")
        >>> logits, state = model.prefill(start, 16, encoder_token_ids=source)
        >>> logits, state = model.decode(start, state, 1)
        """
        hidden_states, caches, _ = self.backbone.decode(
            token_ids,
            None,
            ops.cast(state["encoder_padding_mask"], "bool"),
            self_attention_cache=generation.cache_pairs(state),
            cache_index=index,
            cross_attention_cache=generation.cache_pairs(state, prefix="cross_"),
        )
        if last_only:
            hidden_states = hidden_states[:, -1:]
        return self.lm_head(hidden_states), dict(state, **generation.cache_state(caches))

    def split_generation_inputs(self, inputs):
        """The model's own inputs as the serving interface takes them: `(prompt_ids,
        prompt_mask, context)`: the decoder prompt right-padded with 0, its bool mask, and
        `prefill`'s other arguments (the source)."""
        prompt_ids = inputs["decoder_token_ids"]
        return prompt_ids, ops.not_equal(prompt_ids, PAD_ID), {"encoder_token_ids": inputs["encoder_token_ids"]}

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
        >>> targets = model.generate([[7, 8, 9], [4, 5]], start_token_id=5, max_new_tokens=6)
        >>> [row[:1] for row in targets], [len(row) for row in targets]  # the start token, then 6 new ones
        ([[5], [5]], [7, 7])
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

        return generation.generate(
            self,
            decoder_prompts,
            max_length=max_length,
            max_new_tokens=max_new_tokens,
            sampler=sampler,
            stop_token_ids=stop_token_ids,
            jit_compile=jit_compile,
            limit=self.backbone.max_sequence_length,
            context={"encoder_token_ids": sources},
        )
