import keras
from keras import ops

from kzoo.models import generation
from kzoo.models.gpt.gpt_backbone import GPTBackbone
from kzoo.models.perplexity import Perplexity
from kzoo.models.task import Task
from kzoo.models.tied_logits import TiedLogits


@keras.saving.register_keras_serializable(package="kzoo")
class GPTCausalLM(Task):
    """A GPT language model: a `GPTBackbone` with the tied output projection.

    Predicts each next token: P(w_{t+1} | w_<=t) = softmax(E h_t), where h_t
    is the backbone's top hidden state and E the token embedding table
    shared with the input (no separate output matrix, no bias, as in GPT-2).
    Logits are float32 under any dtype policy.

    Training: feed `x = {"token_ids": ids[:, :-1], "padding_mask": ...}`,
    `y = ids[:, 1:]` and the padding mask of `y` as `sample_weight`.
    `compile()` defaults add `Perplexity` to the accuracy.

    Incremental decoding (the serving interface that `generate`, the
    SavedModel, TFLite and LiteRT-LM files all run): `prefill(token_ids,
    cache_length)` runs a prompt into a KV cache, `decode(token_ids, state,
    index)` runs more tokens against it. A prefill followed by one-token
    steps gives the same logits as a full forward pass.

    Args:
        backbone: a `GPTBackbone`.
        **kwargs: `keras.Model` arguments (`name`).

    Example:
    >>> lm = GPTCausalLM.from_preset("gpt_tiny")
    >>> ids = keras.ops.ones((1, 8), "int32")
    >>> lm({"token_ids": ids, "padding_mask": keras.ops.ones_like(ids)}).shape
    (1, 8, 256)
    """

    backbone_cls = GPTBackbone

    def __init__(self, backbone, **kwargs):
        if not isinstance(backbone, GPTBackbone):
            raise ValueError(f"`backbone` must be a GPTBackbone; received {type(backbone).__name__}.")
        # === Layers ===
        self.backbone = backbone
        self.lm_head = TiedLogits(backbone.embedding, dtype=backbone.dtype_policy, name="lm_head")

        # === Functional model ===
        inputs = backbone.input
        logits = self.lm_head(backbone(inputs))  # (B, T, V) float32
        super().__init__(inputs=inputs, outputs=logits, **kwargs)

    def default_metrics(self):
        return super().default_metrics() + [Perplexity()]

    def prefill(self, token_ids, cache_length):
        """The serving interface's first half: runs the prompt into a new decoding state.

        Args:
            token_ids: int tensor `(B, T)`, 1 <= T <= `cache_length`.
            cache_length: int, the positions of the KV cache (prompt and
                generated tokens together).

        Returns:
            `(logits, state)`: float32 logits `(B, T, V)` and the state for
            `decode`, a dict of `(B, num_heads, cache_length, head_dim)` tensors
            `key_cache_<i>` and `value_cache_<i>` per block (separate tensors,
            so that each step updates them in place). The names are those of
            the exported files' state inputs and outputs.
        """
        batch_size = ops.shape(token_ids)[0]
        caches = [block.empty_cache(batch_size, cache_length) for block in self.backbone.transformer_blocks]
        return self.decode(token_ids, generation.cache_state(caches), 0)

    def decode(self, token_ids, state, index):
        """The serving interface's step: runs `token_ids` `(B, T)` at positions `[index, index + T)`.

        Each block writes the keys and values of the new tokens into the
        state and attends over it, where slots after the current position
        are masked causally. Runs in inference mode (no dropout). A prefill
        followed by steps gives the logits of one full forward pass.

        Args:
            token_ids: int tensor `(B, T)`, T >= 1 (one token per step, or a
                chunk of a longer prompt).
            state: the dict from `prefill` or from the previous `decode`.
            index: int or scalar int tensor, the position of `token_ids[:, 0]`.

        Returns:
            `(logits (B, T, V) float32, state)`.

        Example:
        >>> lm = GPTCausalLM.from_preset("gpt_tiny")
        >>> logits, state = lm.prefill(keras.ops.ones((1, 4), "int32"), cache_length=16)
        >>> logits, state = lm.decode(keras.ops.ones((1, 1), "int32"), state, 4)
        """
        backbone = self.backbone
        x = backbone.embedding(token_ids, start_index=index)  # (B, T, d)
        caches = []
        for block, cache in zip(backbone.transformer_blocks, generation.cache_pairs(state)):
            x, cache = block(x, self_attention_cache=cache, self_attention_cache_index=index)
            caches.append(cache)
        return self.lm_head(backbone.layer_norm(x)), dict(state, **generation.cache_state(caches))

    def split_generation_inputs(self, inputs):
        """The model's own inputs as the serving interface takes them: `(prompt_ids,
        prompt_mask, context)`, the right-padded prompt, its bool mask and `prefill`'s
        other arguments (none)."""
        return inputs["token_ids"], ops.cast(inputs["padding_mask"], "bool"), {}

    def generate(
        self,
        prompts,
        max_length=None,
        max_new_tokens=None,
        sampler="greedy",
        stop_token_ids=None,
        jit_compile=True,
    ):
        """Continues each prompt, one token at a time, with the KV cache.

        The prompts are prefilled together, then one compiled loop decodes
        every position up to `max_length`; rows with shorter prompts keep
        their own prompt tokens until theirs end, so a batch of ragged
        prompts gives each row the tokens it would get alone. Each step
        costs the same at every position (attention spans the fixed-size
        cache). The compiled loop is kept per (batch size, length) and
        reused by later calls.

        Args:
            prompts: a list of token-id lists (ragged), a 2-D int array, a
                dict `{"token_ids", "padding_mask"}` of right-padded prompts,
                or, for a model with a `tokenizer`, a string or a list of
                strings.
            max_length: total length of prompt + continuation; defaults to
                the backbone's `max_sequence_length`.
            max_new_tokens: alternatively, the number of tokens to add after
                the longest prompt.
            sampler: "greedy", "random", "top_k", "top_p", "beam" or a
                `kzoo.samplers.Sampler` (e.g. `TopKSampler(k=10, seed=0)`).
            stop_token_ids: ids that end a row (e.g. the end-of-text id);
                later slots of that row stay padding.
            jit_compile: bool, compile the loop with XLA (TensorFlow).

        Returns:
            For a list: a list of id lists (prompt + continuation, up to and
            including a stop token). For strings: the text of the same (a
            string for a string). Otherwise a dict with "token_ids"
            `(B, max_length)` and "padding_mask" (prompt or generated).

        Example:
        >>> lm = GPTCausalLM.from_preset("gpt_tiny")
        >>> lm.generate([[72, 105], [84]], max_new_tokens=5)  # two continuations
        >>> lm.generate("ROMEO:", max_new_tokens=20)  # with a tokenizer: text
        """
        from kzoo.models import text_inputs  # TensorFlow ops

        if text_inputs.is_text(prompts):
            if self.tokenizer is None:
                raise ValueError("This GPTCausalLM has no tokenizer: give token ids, or build it with `tokenizer=`.")
            texts = [prompts] if isinstance(prompts, (str, bytes)) else list(prompts)
            token_ids = text_inputs.tokenize(self.tokenizer, texts).to_list()
            outputs = self.generate(token_ids, max_length, max_new_tokens, sampler, stop_token_ids, jit_compile)
            outputs = [text_inputs.detokenize(self.tokenizer, row) for row in outputs]
            return outputs[0] if isinstance(prompts, (str, bytes)) else outputs

        return generation.generate(
            self,
            prompts,
            max_length=max_length,
            max_new_tokens=max_new_tokens,
            sampler=sampler,
            stop_token_ids=stop_token_ids,
            jit_compile=jit_compile,
            limit=self.backbone.max_sequence_length,
        )
