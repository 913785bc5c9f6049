"""Speculative decoding: a drafter proposes tokens, the target model checks them in one pass.

Each round the drafter proposes up to `k` tokens: a small draft model one at a time with its
own KV cache, or `PromptLookup` by copying what followed the last few tokens where they
stood earlier in the sequence (prompt-lookup decoding: no second model, and nothing to pay
for a proposal). The target model then runs the last committed token and the proposals
through one `decode` call (k + 1 positions), which gives its own prediction at each of them.
The longest prefix of proposals the target accepts is kept, followed by one token of the
target's own: a round costs one target step and yields between 1 and k + 1 tokens. A round
in which `PromptLookup` finds nothing to copy runs the target on one position instead.

- Greedy: a proposal is accepted when it is the target's argmax, and the target's argmax
  follows the accepted prefix, so the output is the target's own greedy output.
- Sampling (`RandomSampler`, `TopKSampler`, `TopPSampler`): with p the target's and q the
  draft's distribution (the sampler's temperature and filter applied to each), proposal
  x ~ q is accepted with probability min(1, p(x) / q(x)); at the first rejection the next
  token is drawn from normalize(max(0, p - q)), after k acceptances from p. Every token is
  then distributed exactly as the target's own sampling would draw it (Leviathan et al.;
  Chen et al., 2023). A copied proposal is a q that puts all its mass on it: accepted with
  probability p(x), else the next token is drawn from p without x.

The whole generation is one compiled `while_loop`, both caches inside it (with
`jit_compile="draft"`, a TensorFlow graph whose draft steps are compiled with XLA). The caches are
indexed by position and a causal query at position t attends to slots <= t only, so slots
written by rejected proposals need no rollback: they are written again before any query
reads them. Batch size 1 only: each row of a batch would accept a count of its own.

References:
    Leviathan, Kalman and Matias, "Fast Inference from Transformers via Speculative
    Decoding", 2023. Chen et al., "Accelerating Large Language Model Decoding with
    Speculative Sampling", 2023.
"""

import dataclasses
import weakref

import keras
import numpy as np
from keras import ops

from kzoo import samplers as samplers_lib
from kzoo.models import generation
from kzoo.validation import check_int

# The draft length when none is given: a round of k proposals costs k draft steps and one
# target step, and yields k + 1 tokens at best.
DEFAULT_DRAFT_TOKENS = 4
# More proposals per round than this would almost all be rejected.
MAX_DRAFT_TOKENS = 64

# target -> draft -> (length, prefill, draft tokens, sampler, jit_compile) -> compiled loop.
_COMPILED = weakref.WeakKeyDictionary()
# target -> (PromptLookup, length, prefill, draft tokens, sampler, jit_compile) -> compiled loop.
_COMPILED_LOOKUP = weakref.WeakKeyDictionary()


@dataclasses.dataclass(frozen=True)
class SpeculativeStats:
    """What one speculative `generate` call did.

    Attributes:
        proposed: the draft tokens the target checked (prompt positions not counted).
        accepted: those it accepted.
        target_steps: the target's `decode` calls (rounds), the prefill not counted.
        draft_tokens: the draft length used (after clamping to the new tokens asked).
    """

    proposed: int
    accepted: int
    target_steps: int
    draft_tokens: int

    @property
    def acceptance_rate(self):
        """`accepted / proposed` (0 when nothing was proposed)."""
        return self.accepted / self.proposed if self.proposed else 0.0


# The n-gram sizes `PromptLookup` may look up: a longer suffix is hardly ever seen again.
MAX_NGRAM_SIZE = 16


@dataclasses.dataclass(frozen=True)
class PromptLookup:
    """Drafts by copying: the tokens that followed the sequence's last n tokens where they stood before.

    Pass it as `draft_model` to speculative decoding when the output repeats its input: code
    edited or explained, a document summarized or quoted, a form filled. Each round looks up
    the last `max_ngram_size` tokens earlier in the sequence (prompt and generated tokens), then
    shorter suffixes down to `min_ngram_size`, and proposes what followed their first
    occurrence, as far as it is known. Nothing is run to propose, so a round costs one target
    step; where nothing matches, the target runs one position, as `generate` alone does. The
    output is the target's own, as with a draft model.

    Args:
        max_ngram_size: int in [1, 16], the longest suffix looked up.
        min_ngram_size: int in [1, max_ngram_size], the shortest: a single token matches often
            and predicts little.

    Example:
    >>> lm = kzoo.models.CausalLM.from_preset("llama_tiny")
    >>> prompt = [[5, 6, 7, 8, 9, 10, 5, 6]]
    >>> ids = lm.generate(prompt, max_new_tokens=8, draft_model=PromptLookup())
    >>> ids == lm.generate(prompt, max_new_tokens=8)  # the model's own greedy output
    True

    References:
        Saxena, "Prompt Lookup Decoding", 2023 (https://github.com/apoorvumang/prompt-lookup-decoding);
        transformers' `prompt_lookup_num_tokens`.
    """

    max_ngram_size: int = 3
    min_ngram_size: int = 2

    def __post_init__(self):
        check_int("max_ngram_size", self.max_ngram_size, 1, MAX_NGRAM_SIZE)
        check_int("min_ngram_size", self.min_ngram_size, 1, self.max_ngram_size)

    def propose(self, token_ids, n, positions):
        """The copied proposals for `positions` and which of them are known.

        Args:
            token_ids: int `(1, L)`, the sequence; positions `< n` are committed.
            n: scalar int, the committed length (>= 1).
            positions: int `(k,)`, the positions to propose tokens for (those `>= n` are asked).

        Returns:
            `(proposals (k,) int32, proposed (k,) bool)`: the token each position gets from the
            first earlier occurrence of the longest suffix found, and whether it got one.
        """
        ids = token_ids[0]
        size = ids.shape[0]
        index = ops.arange(size, dtype="int32")
        found = ops.convert_to_tensor(False)
        end = ops.zeros((), "int32")  # where the occurrence found ends
        for g in range(self.max_ngram_size, self.min_ngram_size - 1, -1):  # the longest suffix first
            match = ops.logical_and(index >= g - 1, index <= n - 2)  # an earlier occurrence, a token after it
            for i in range(g):
                earlier = ops.concatenate([ops.zeros((i,), ids.dtype), ids[: size - i]])  # earlier[j] = ids[j - i]
                match = ops.logical_and(match, ops.equal(earlier, ops.take(ids, ops.maximum(n - 1 - i, 0))))
            first = ops.cast(ops.argmax(ops.cast(match, "int32")), "int32")
            end = ops.where(found, end, first)
            found = ops.logical_or(found, ops.any(match))
        source = end + 1 + positions - n  # the token copied for each position
        proposed = ops.logical_and(ops.logical_and(found, positions >= n), source < n)
        proposals = ops.take(ids, ops.clip(source, 0, size - 1))
        return ops.cast(proposals, "int32"), proposed


def generate(
    target,
    prompts,
    *,
    draft_model,
    draft_tokens=None,
    max_length=None,
    max_new_tokens=None,
    sampler="greedy",
    stop_token_ids=None,
    jit_compile=True,
):
    """`target.generate(prompts, ...)` with `draft_model` proposing tokens, and what it accepted.

    Args:
        target: a `kzoo.models.CausalLM`, the model whose output this is.
        prompts: one prompt: a list holding one token-id list, a `(1, T)` int array or a
            dict `{"token_ids", "padding_mask"}` of one row.
        draft_model: a `kzoo.models.CausalLM` with the target's vocabulary (and tokenizer,
            where both have one) and a context as long as `max_length`, or a `PromptLookup`.
        draft_tokens: None (`DEFAULT_DRAFT_TOKENS`, 4) or an int in [1, 64]: the most tokens
            proposed per round, clamped to the new tokens asked.
        max_length, max_new_tokens, stop_token_ids: as in `CausalLM.generate`.
        jit_compile: True (the whole loop compiled with XLA), False (a TensorFlow graph), or
            "draft": a TensorFlow graph whose draft-model calls are compiled with XLA, so
            that the target checks its k + 1 positions with TensorFlow's own matrix
            products. Those read the weights once for all k + 1 rows where XLA's CPU
            product reads them about twice; with a bfloat16 target on a CPU with AMX a
            check costs about one step (BENCHMARKS.md, "On an AMX host"). A bfloat16
            target rounds a check of k + 1 positions otherwise than a step of one, so
            where two of its logits are within that rounding the output may take the
            other one. Not with `PromptLookup`, which has no draft steps.
        sampler: "greedy", "random", "top_k", "top_p" or such a `kzoo.samplers.Sampler`
            (not beam search).

    Returns:
        `(outputs, stats)`: what `target.generate` returns for `prompts`, and a
        `SpeculativeStats`.

    Example:
    >>> target = kzoo.models.CausalLM.from_preset("llama_tiny")
    >>> draft = kzoo.models.GPTCausalLM.from_preset("gpt_tiny")
    >>> ids, stats = generate(target, [[72, 105]], draft_model=draft, max_new_tokens=8)
    >>> ids == target.generate([[72, 105]], max_new_tokens=8)  # the target's own greedy output
    True
    >>> stats.proposed >= stats.accepted
    True
    """
    check_draft_model(target, draft_model)
    draft_tokens = check_draft_tokens(draft_tokens)
    lookup = isinstance(draft_model, PromptLookup)
    check_jit_compile(jit_compile, lookup)
    sampler, stop = generation.resolve(sampler, stop_token_ids)
    if isinstance(sampler, samplers_lib.BeamSampler):
        raise ValueError(
            "`sampler` cannot be beam search with `draft_model`: speculative decoding checks one "
            "continuation; use greedy, random, top_k or top_p."
        )
    generation.check_generate_arguments(target, prompts, max_length, max_new_tokens, stop_token_ids)
    token_ids, prompt_mask, ragged = generation.pack_prompts(
        prompts, max_length, max_new_tokens, target.backbone.max_sequence_length
    )
    batch, length = token_ids.shape
    if batch != 1:
        raise ValueError(
            f"`draft_model` supports batch size 1 only (each row would accept a count of its own); "
            f"received {batch} prompts. Generate them one at a time."
        )
    draft_limit = None if lookup else draft_model.backbone.max_sequence_length
    if draft_limit is not None and draft_limit < length:
        raise ValueError(
            f"`draft_model` has a maximum sequence length of {draft_limit}, shorter than the {length} "
            "positions asked: give a shorter `max_length` / `max_new_tokens` or a draft with a longer context."
        )
    k = min(draft_tokens, length - int(prompt_mask.sum()))
    prefill = generation.prefill_length(prompt_mask)
    key = (length, prefill, k, generation.sampler_key(sampler), jit_compile)
    if lookup:  # settings, not a model: equal lookups share a loop
        functions = _COMPILED_LOOKUP.setdefault(target, {})
        key = (draft_model, *key)
    else:
        functions = _COMPILED.setdefault(target, weakref.WeakKeyDictionary()).setdefault(draft_model, {})
    if key not in functions:
        # Weak references, as in `generation.generate`: the cache's keys are the models.
        target_ref = weakref.ref(target)
        draft_ref = (lambda: draft_model) if lookup else weakref.ref(draft_model)

        def run(token_ids, prompt_mask, stop_token_ids, noise):
            return speculative_loop(
                target_ref(),
                draft_ref(),
                sampler,
                token_ids,
                prompt_mask,
                prefill,
                k,
                stop_token_ids,
                noise,
                compile_draft=jit_compile == "draft",
            )

        models = (target,) if lookup else (target, draft_model)
        functions[key] = generation.compile_function(run, jit_compile is True, models=models)
    # One slot past the end, so that every round reads a window of k + 1 positions.
    padded_ids = np.pad(token_ids, ((0, 0), (0, 1)))
    padded_mask = np.pad(prompt_mask, ((0, 0), (0, 1)))
    # A round draws k proposals, k acceptance tests and one correction; rounds are keyed by
    # their first new position, which grows every round.
    noise = sampler.noise(length, 2 * k + 1)
    ids, generated, counts = functions[key](padded_ids, padded_mask, stop, noise)
    outputs = generation.unpack(ids[:, :length], ops.convert_to_numpy(generated)[:, :length], prompt_mask, ragged)
    proposed, accepted, steps = (int(c) for c in ops.convert_to_numpy(counts))
    return outputs, SpeculativeStats(proposed, accepted, steps, k)


def speculative_loop(
    target, draft, sampler, token_ids, prompt_mask, prefill, draft_tokens, stop_token_ids, noise, compile_draft=False
):
    """Prefills both models with the first `prefill` positions and the rest of the prompt in
    chunks (`generation.prompt_chunk`), then decodes the rest in rounds.

    Positions `< n` are committed; the target's cache holds them up to `n - 2`, the draft's
    up to `n - 3`, and each round writes again what it needs. A round starts its window at
    `s = min(n - 1, L - 1 - k)` (so that k + 1 positions fit in the caches): the target
    runs positions `[s, s + k]`, whose predictions are for `[s + 1, s + k + 1]`. Positions of
    the window that are committed already, or prompt tokens, are forced: their proposal is
    the known token, always accepted, which is also how the rest of the prompt is read.

    Args:
        target: a `CausalLM`.
        draft: a `CausalLM`, or a `PromptLookup` (no state, nothing run to propose).
        sampler: a `kzoo.samplers.Sampler`, greedy or one that samples.
        token_ids: int `(1, L + 1)`, the prompt right-padded to L positions and one more.
        prompt_mask: bool `(1, L + 1)`, True on prompt tokens.
        prefill: int in [1, prompt length].
        draft_tokens: int k in [1, L - 1].
        stop_token_ids: int `(N,)`, possibly empty.
        noise: uniform `(L, 2k + 1)`.
        compile_draft: compile the draft's prefill and each round's draft steps with XLA
            (`jit_compile="draft"`), when the loop itself is traced as a TensorFlow graph.

    Returns:
        `(token_ids (1, L + 1), generated (1, L + 1) bool, counts (3,))`, counts being the
        proposed and accepted draft tokens and the rounds.
    """
    k = draft_tokens
    length = token_ids.shape[1] - 1
    greedy = isinstance(sampler, samplers_lib.GreedySampler)
    lookup = isinstance(draft, PromptLookup)

    def draft_prefill(token_ids, prompt_mask):
        logits, state = draft.prefill(token_ids[:, :prefill], length, last_only=True)
        return generation.read_prompt_rest(draft, token_ids, prompt_mask, state, logits[:, -1], prefill)[1]

    def draft_proposals(token_ids, s, window, forced, u, draft_state):
        return _draft_model_proposals(draft, sampler, token_ids, s, k, window, forced, u, draft_state)

    if compile_draft:
        draft_prefill = generation.compile_function(draft_prefill, True)
        draft_proposals = generation.compile_function(draft_proposals, True)
    # The rest of the prompt in chunks, as `generate` reads it; rounds would read it k + 1
    # positions at a time, the draft's a token at a time.
    logits, target_state = target.prefill(token_ids[:, :prefill], length, last_only=True)
    rest = generation.read_prompt_rest(target, token_ids, prompt_mask, target_state, logits[:, -1], prefill)
    _, target_state, n = rest
    draft_state = () if lookup else draft_prefill(token_ids, prompt_mask)
    offsets = ops.arange(k + 1, dtype="int32")
    vocabulary_size = target.backbone.vocabulary_size

    def cond(token_ids, generated, n, done, target_state, draft_state, counts):
        return ops.logical_and(n < length, ops.logical_not(done))

    def body(token_ids, generated, n, done, target_state, draft_state, counts):
        s = ops.minimum(n - 1, length - 1 - k)
        positions = s + 1 + offsets  # (k + 1,)
        window = ops.slice(token_ids, (0, s + 1), (1, k + 1))[0]
        in_prompt = ops.slice(prompt_mask, (0, s + 1), (1, k + 1))[0]
        forced = ops.logical_or(positions < n, in_prompt)
        u = noise[n]  # (2k + 1,)

        if lookup:
            proposals, proposed = draft.propose(token_ids, n, positions[:k])
            proposed = ops.logical_and(proposed, ops.logical_not(forced[:k]))
            proposals = ops.where(forced[:k], window[:k], proposals)
            # All of q's mass on the copied token (none where nothing was copied).
            q = None if greedy else ops.one_hot(proposals, vocabulary_size) * ops.cast(proposed, "float32")[:, None]
        else:
            proposals, q, draft_state = draft_proposals(token_ids, s, window, forced, u, draft_state)
            proposed = ops.logical_not(forced[:k])

        # The target: its predictions for the k + 1 positions after s in one step.
        chunk = ops.concatenate([ops.slice(token_ids, (0, s), (1, 1)), proposals[None]], axis=1)

        def check_window():
            logits, state = target.decode(chunk, target_state, s)
            return logits[0], state

        if lookup:  # a round that copies nothing and reads no known token runs the one position `generate` would

            def next_only():
                logits, state = target.decode(chunk[:, :1], target_state, s)
                return ops.pad(logits[0], [(0, k), (0, 0)]), state

            reads = ops.logical_or(ops.any(proposed), ops.any(forced))
            logits, target_state = ops.cond(reads, check_window, next_only)  # (k + 1, V)
        else:
            logits, target_state = check_window()
        if greedy:
            choices = ops.cast(ops.argmax(logits, axis=-1), "int32")
            agrees = ops.equal(proposals, choices[:k])
        else:
            p = distribution(sampler, logits)  # (k + 1, V)
            p_proposed = ops.take_along_axis(p[:k], proposals[:, None], axis=1)[:, 0]
            q_proposed = ops.take_along_axis(q, proposals[:, None], axis=1)[:, 0]
            agrees = u[k : 2 * k] * q_proposed < p_proposed
        agrees = ops.logical_and(agrees, proposed)
        accepted = ops.cast(ops.cumprod(ops.cast(ops.logical_or(forced[:k], agrees), "int32")), "bool")
        count = ops.sum(ops.cast(accepted, "int32"))  # a: proposals accepted, 0..k
        if greedy:
            correction = ops.take(choices, count)
        else:
            p_next = ops.take(p, count, axis=0)
            q_next = ops.take(ops.concatenate([q, ops.zeros((1, vocabulary_size))], axis=0), count, axis=0)
            residual = ops.maximum(p_next - q_next, 0.0)
            total = ops.sum(residual)
            correction = draw(ops.where(total > 0, residual / ops.where(total > 0, total, 1.0), p_next), u[2 * k])
        correction = ops.where(ops.take(forced, count), ops.take(window, count), correction)
        values = ops.where(offsets < count, ops.pad(proposals, [(0, 1)]), correction)

        # Commit positions [n, s + a + 1] (within the length), up to the first stop token.
        write = ops.logical_and(ops.logical_and(positions >= n, offsets <= count), positions < length)
        new = ops.logical_and(write, ops.logical_not(in_prompt))
        stops = ops.logical_and(new, _isin(values, stop_token_ids))
        stopped = ops.any(stops)
        write = ops.logical_and(
            write, ops.logical_or(ops.logical_not(stopped), offsets <= ops.argmax(ops.cast(stops, "int32")))
        )
        new = ops.logical_and(new, write)
        token_ids = ops.slice_update(token_ids, (0, s + 1), ops.where(write, values, window)[None])
        old = ops.slice(generated, (0, s + 1), (1, k + 1))
        generated = ops.slice_update(generated, (0, s + 1), ops.logical_or(old, new[None]))

        counts = counts + ops.stack(
            [
                ops.sum(ops.cast(proposed, "int32")),
                ops.sum(ops.cast(ops.logical_and(proposed, accepted), "int32")),
                ops.convert_to_tensor(1, "int32"),
            ]
        )
        return token_ids, generated, s + count + 2, stopped, target_state, draft_state, counts

    generated = ops.zeros_like(prompt_mask)
    done = ops.convert_to_tensor(False)
    counts = ops.zeros((3,), "int32")
    state = (token_ids, generated, n, done, target_state, draft_state, counts)
    token_ids, generated, _, _, _, _, counts = ops.while_loop(cond, body, state)
    return token_ids, generated, counts


def _draft_model_proposals(draft, sampler, token_ids, s, k, window, forced, u, draft_state):
    """The draft model's `k` proposals for positions `[s + 1, s + k]` (the known token where
    `forced`), the distributions `q` they were drawn from (`(k, 1)` for greedy), and its state."""
    greedy = isinstance(sampler, samplers_lib.GreedySampler)
    vocabulary_size = draft.backbone.vocabulary_size

    def propose(j, logits, proposals, q):
        """Puts the proposal for window slot `j` from the draft's logits `(V,)`."""
        if greedy:
            token = ops.cast(ops.argmax(logits), "int32")
        else:
            probabilities = distribution(sampler, logits[None])[0]
            token = draw(probabilities, u[j])
            q = ops.slice_update(q, (j, 0), probabilities[None])
        token = ops.where(ops.take(forced, j), ops.take(window, j), token)
        return ops.slice_update(proposals, (j,), ops.reshape(token, (1,))), q

    # Two positions first ([s - 1, s], writing s - 1 again: the last round may have accepted a
    # token it never ran), then one per proposal.
    start = ops.maximum(s - 1, 0)
    logits, draft_state = draft.decode(ops.slice(token_ids, (0, start), (1, 2)), draft_state, start)
    proposals = ops.zeros((k,), "int32")
    q = ops.zeros((k, 1 if greedy else vocabulary_size), "float32")
    proposals, q = propose(0, ops.take(logits[0], s - start, axis=0), proposals, q)

    def draft_step(j, carry):
        proposals, q, draft_state = carry
        token = ops.reshape(ops.take(proposals, j - 1), (1, 1))
        logits, draft_state = draft.decode(token, draft_state, s + j)
        proposals, q = propose(j, logits[0, -1], proposals, q)
        return proposals, q, draft_state

    return ops.fori_loop(1, k, draft_step, (proposals, q, draft_state))


def distribution(sampler, logits):
    """The normalized distribution `(B, V)` that `sampler` draws from, of logits `(B, V)`."""
    probabilities = sampler.filter_probabilities(ops.softmax(ops.cast(logits, "float32") / sampler.temperature))
    return probabilities / ops.sum(probabilities, axis=-1, keepdims=True)


def draw(probabilities, noise):
    """The id `()` that inverting the cumulative distribution of `probabilities` `(V,)` gives at `noise`."""
    cdf = ops.cumsum(probabilities)
    token = ops.sum(ops.cast(cdf <= noise * cdf[-1], "int32"))
    return ops.minimum(token, ops.shape(probabilities)[0] - 1)


def check_draft_model(target, draft_model):
    """Raises `ValueError` unless `draft_model` is a `PromptLookup` or a `CausalLM` that speaks the
    target's vocabulary: the same `vocabulary_size`, and where both carry a tokenizer, the same
    tokens and special ids."""
    from kzoo.models.decoder.causal_lm import CausalLM

    if isinstance(draft_model, PromptLookup):
        return
    if not isinstance(draft_model, CausalLM):
        raise ValueError(
            f"`draft_model` must be a kzoo CausalLM or a PromptLookup; received {type(draft_model).__name__}."
        )
    size, draft_size = target.backbone.vocabulary_size, draft_model.backbone.vocabulary_size
    if size != draft_size:
        raise ValueError(
            f"`draft_model` must have the target's vocabulary_size ({size}); received a draft with {draft_size}."
        )
    tokenizer, draft_tokenizer = target.tokenizer, draft_model.tokenizer
    if tokenizer is None or draft_tokenizer is None or tokenizer is draft_tokenizer:
        return
    for name in _SPECIAL_IDS:
        mine, theirs = getattr(tokenizer, name, None), getattr(draft_tokenizer, name, None)
        if mine != theirs:
            raise ValueError(
                f"`draft_model`'s tokenizer differs from the target's: its {name} is {theirs}, the target's {mine}."
            )
    vocabulary, draft_vocabulary = _tokens(tokenizer), _tokens(draft_tokenizer)
    if vocabulary != draft_vocabulary:
        first = next((i for i, (a, b) in enumerate(zip(vocabulary, draft_vocabulary)) if a != b), None)
        where = (
            f"id {first} is {draft_vocabulary[first]!r} in the draft, {vocabulary[first]!r} in the target"
            if first is not None
            else f"the draft has {len(draft_vocabulary)} tokens, the target {len(vocabulary)}"
        )
        raise ValueError(f"`draft_model`'s tokenizer differs from the target's: {where}.")


# The special ids of a tokenizer that a draft must share (those a tokenizer has).
_SPECIAL_IDS = ("start_token_id", "end_token_id", "pad_token_id", "bos_token_id", "eos_token_id", "unk_token_id")


def _tokens(tokenizer):
    """The tokenizer's tokens in id order (`get_vocabulary` gives a list or a token -> id dict)."""
    vocabulary = tokenizer.get_vocabulary()
    if isinstance(vocabulary, dict):
        return sorted(vocabulary, key=vocabulary.get)
    return list(vocabulary)


def check_jit_compile(jit_compile, lookup):
    """Raises ValueError unless `jit_compile` is True, False or "draft" (not with a `PromptLookup`,
    and only under TensorFlow)."""
    if jit_compile is True or jit_compile is False:
        return
    if jit_compile != "draft":
        raise ValueError(f'`jit_compile` must be True, False or "draft"; received {jit_compile!r}.')
    if lookup:
        raise ValueError(
            '`jit_compile="draft"` compiles a draft model\'s steps; a PromptLookup has none: use True or False.'
        )
    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            '`jit_compile="draft"` traces the loop and the target\'s check as a TensorFlow graph, which only '
            f"Keras' TensorFlow backend has; under {keras.backend.backend()} use True (the whole loop compiled)."
        )


def check_draft_tokens(draft_tokens):
    """`draft_tokens` as an int in [1, MAX_DRAFT_TOKENS] (None: `DEFAULT_DRAFT_TOKENS`)."""
    if draft_tokens is None:
        return DEFAULT_DRAFT_TOKENS
    return check_int("draft_tokens", draft_tokens, 1, MAX_DRAFT_TOKENS)


def _isin(tokens, stop_token_ids):
    """`tokens (T,)` in `stop_token_ids (S,)`, False when S == 0."""
    return ops.any(ops.equal(tokens[:, None], ops.cast(stop_token_ids, tokens.dtype)[None, :]), axis=-1)
