"""Speculative decoding (`generate(..., draft_model=...)`): the target's own greedy output token
for token, its own sampling distribution, stop tokens, chat, the acceptance counts, and the
errors for a draft that cannot serve.

Most tests trace the loop as a TensorFlow graph (`jit_compile=False`), the code XLA compiles by
default; one checks that XLA gives the same tokens. The models have one layer each: the loop
hands the caches to the models whole (more layers are the decoders' own business, which the
generate tests cover), and tracing each layer again in every draft and target call is most of
these tests' time.
"""

import keras
import numpy as np
import pytest

import kzoo
from kzoo import samplers
from kzoo.models.decoder import speculative
from kzoo.models.decoder.causal_lm import CHAT_LENGTH_STEP
from kzoo.tokenizers import HFTokenizer
from kzoo.tokenizers.chat_template import stop_token_ids
from tests.models import tokenizer_files

LENGTH = 24


@pytest.fixture(scope="module")
def target():
    keras.utils.set_random_seed(3)
    lm = kzoo.models.CausalLM(kzoo.models.DecoderBackbone.from_preset("llama_tiny", num_layers=1))
    # Larger logits than the default init: no near-ties for float rounding to flip.
    lm.set_weights([w * 3 for w in lm.get_weights()])
    return lm


@pytest.fixture(scope="module")
def draft():
    """Another architecture (GPT-2's) of the same vocabulary: it rarely agrees with the target."""
    keras.utils.set_random_seed(4)
    lm = kzoo.models.GPTCausalLM(kzoo.models.GPTBackbone.from_preset("gpt_tiny", num_layers=1))
    lm.set_weights([w * 3 for w in lm.get_weights()])
    return lm


def speculate(target, prompt, **kwargs):
    kwargs = {"max_length": LENGTH, "jit_compile": False, **kwargs}
    return speculative.generate(target, prompt if isinstance(prompt, dict) else [prompt], **kwargs)


SEVEN_TOKENS = [7, 3, 9, 1, 2, 5, 8]


@pytest.mark.parametrize("prompt, draft_tokens", [([7], 1), (SEVEN_TOKENS, 4)], ids=["one_token-1", "seven_tokens-4"])
def test_greedy_output_is_the_targets_own(target, draft, prompt, draft_tokens):
    """One token of prompt (nothing before it to run again) and one proposal a round (no draft
    step after the first), and seven (a prefill of four, the other three read in the first round
    beside a proposal) and four proposals a round; a draft that disagrees and the target drafting
    for itself."""
    expected = target.generate([prompt], max_length=LENGTH, jit_compile=False)
    ids, stats = speculate(target, prompt, draft_model=draft, draft_tokens=draft_tokens)
    assert ids == expected
    assert stats.accepted < stats.proposed / 2  # a draft that rarely agrees: the rejection path ran
    ids, stats = speculate(target, prompt, draft_model=target, draft_tokens=draft_tokens)
    assert ids == expected
    assert stats.accepted == stats.proposed and stats.acceptance_rate == 1.0
    # Every round yields k + 1 tokens (the last round what is left).
    assert stats.target_steps <= -(-(LENGTH - len(prompt)) // (draft_tokens + 1)) + 2


def test_the_rest_of_a_long_prompt_is_read_before_the_rounds(target, draft):
    """A prompt of 21 tokens: a prefill of 16, then positions 16-20 in chunks of 4 in both models
    (`generation.prompt_chunk`), so that the first round already proposes. The target drafting
    for itself (everything accepted) takes the rounds 11 new tokens take from there, 3, where a
    round reading the prompt's rest first made 4."""
    prompt = np.random.default_rng(5).integers(1, 200, 21).tolist()
    expected = target.generate([prompt], max_length=32, jit_compile=False)
    ids, _ = speculate(target, prompt, draft_model=draft, draft_tokens=4, max_length=32)
    assert ids == expected
    ids, stats = speculate(target, prompt, draft_model=target, draft_tokens=4, max_length=32)
    assert ids == expected
    assert stats.target_steps == 3


def test_xla_gives_the_same_tokens(target, draft):
    # The target's greedy tokens from its traced loop (the greedy test's, so not traced again):
    # no near-ties (the weights are scaled up) for XLA's rounding to flip.
    prompt = [7]
    expected = target.generate([prompt], max_length=LENGTH, jit_compile=False)
    assert target.generate([prompt], max_length=LENGTH, draft_model=draft) == expected


def test_draft_steps_alone_compiled_with_xla_give_the_same_tokens(target, draft, monkeypatch):
    """`jit_compile="draft"`: the draft's prefill and steps traced inside XLA computations, the target's
    check and its prefills in the TensorFlow graph around it, and still the target's tokens."""
    from kzoo.ops import _fusion

    modes = {"target": set(), "draft": set()}
    for name, lm in (("target", target), ("draft", draft)):

        def decode(*args, lm=lm, name=name, **kwargs):
            modes[name].add(_fusion.execution_mode())
            return type(lm).decode(lm, *args, **kwargs)

        monkeypatch.setattr(lm, "decode", decode)
    expected = target.generate([SEVEN_TOKENS], max_length=LENGTH, jit_compile=False)
    modes["target"].clear()
    ids, stats = speculate(target, SEVEN_TOKENS, draft_model=draft, draft_tokens=3, jit_compile="draft")
    assert ids == expected and stats.proposed > 0
    assert modes == {"target": {"graph"}, "draft": {"xla"}}


def test_stops_at_the_first_stop_token_the_target_emits(target, draft):
    prompt = [7]  # the greedy test's: `plain` is not traced again
    plain = target.generate([prompt], max_length=LENGTH, jit_compile=False)[0]
    stop = plain[len(prompt) + 4]  # the fifth new token: within the first or second round
    expected = target.generate([prompt], max_length=LENGTH, stop_token_ids=[stop], jit_compile=False)
    assert expected[0][-1] == stop and len(expected[0]) <= len(prompt) + 5
    for model in (draft, target):
        ids, _ = speculate(target, prompt, draft_model=model, draft_tokens=3, stop_token_ids=[stop])
        assert ids == expected
    # The arrays of a dict prompt: what follows the stop stays padding, out of the mask.
    packed = {"token_ids": np.array([prompt + [0] * 6]), "padding_mask": np.array([[1] + [0] * 6])}
    expected = target.generate(packed, max_length=LENGTH, stop_token_ids=[stop], jit_compile=False)
    ids, _ = speculate(target, packed, draft_model=target, draft_tokens=3, stop_token_ids=[stop])
    np.testing.assert_array_equal(ids["token_ids"], expected["token_ids"])
    np.testing.assert_array_equal(ids["padding_mask"], expected["padding_mask"])


def test_draft_tokens_past_the_new_tokens_are_clamped(target, draft):
    ids, stats = speculate(target, [7, 3], draft_model=draft, draft_tokens=64, max_length=None, max_new_tokens=3)
    assert ids == target.generate([[7, 3]], max_new_tokens=3, jit_compile=False)
    assert stats.draft_tokens == 3
    _, stats = speculate(target, SEVEN_TOKENS, draft_model=draft)  # the greedy test's seven_tokens-4 loop
    assert stats.draft_tokens == speculative.DEFAULT_DRAFT_TOKENS == 4


def tiny_lm(seed, vocabulary_size=6):
    keras.utils.set_random_seed(seed)
    backbone = kzoo.models.DecoderBackbone(
        vocabulary_size=vocabulary_size,
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=8,
    )
    lm = kzoo.models.CausalLM(backbone)
    lm.set_weights([w * 4 for w in lm.get_weights()])  # peaked, but not one-hot, distributions
    return lm


def exact_distribution(lm, prompt, sampler, steps):
    """The probability of every continuation of `steps` tokens `(V,) * steps`, as `sampler` draws."""
    vocabulary_size = lm.backbone.vocabulary_size
    prefixes = np.array([prompt], "int32")
    joint = np.ones((1,))
    for _ in range(steps):
        logits = np.asarray(lm({"token_ids": prefixes, "padding_mask": np.ones_like(prefixes)}))[:, -1]
        p = np.asarray(speculative.distribution(sampler, logits), "float64")
        joint = (joint[:, None] * p).reshape(-1)
        prefixes = np.concatenate(
            [np.repeat(prefixes, vocabulary_size, axis=0), np.tile(np.arange(vocabulary_size), len(prefixes))[:, None]],
            axis=1,
        ).astype("int32")
    return joint


def chi_square_p_value(counts, expected_probabilities):
    """Pearson's test of `counts` against the probabilities, cells of expected count < 5 pooled."""
    from scipy import stats

    expected = expected_probabilities / expected_probabilities.sum() * counts.sum()
    small = expected < 5
    observed = np.append(counts[~small], counts[small].sum())
    expected = np.append(expected[~small], expected[small].sum())
    return stats.chisquare(observed, expected).pvalue


@pytest.mark.parametrize("lookup", [False, True], ids=["draft_model", "prompt_lookup"])
@pytest.mark.parametrize(
    "sampler", [samplers.RandomSampler(), samplers.TopKSampler(k=3, temperature=0.8)], ids=["random", "top_k"]
)
def test_sampling_keeps_the_targets_distribution(sampler, lookup):
    """The first three new tokens (216 continuations), drawn 400 times with a draft of other
    weights, against the target's exact distribution: the rejection rule (accept with
    min(1, p / q), else draw from max(0, p - q)) gives p itself, where sampling from the draft
    would be far off.

    400 draws are enough for the slips it is there for: enumerating the algorithm exactly, a
    residual of p itself instead of max(0, p - q) (over 0.2 from p in total variation), an
    acceptance of min(1, q / p), accepting every proposal or a residual of max(0, q - p) fails
    the chi-square test in over 99.9% of 2,000 simulated runs for each sampler, and the right
    rule in 0.1-0.2% of them, as with 800 draws. (A token after k acceptances drawn from the
    draft rather than the target, 0.02-0.09 from p, is below what either count sees reliably.)

    `PromptLookup` proposes a copy, a q with all its mass on one token: over six tokens, a
    prompt of two and single-token suffixes, most rounds copy something."""
    target, draft = tiny_lm(1), tiny_lm(2)
    prompt, steps, runs = ([3, 3] if lookup else [3]), 3, 400
    p = exact_distribution(target, prompt, sampler, steps)
    if lookup:
        draft = kzoo.models.PromptLookup(max_ngram_size=1, min_ngram_size=1)
    else:
        q = exact_distribution(draft, prompt, sampler, steps)
        assert 0.5 * np.abs(p - q).sum() > 0.4  # the draft's own sampling would fail the test
    counts = np.zeros(p.shape)
    proposed = accepted = 0
    # One unseeded sampler, built after the test's fixed seed: each call draws new noise from its
    # seed generator (building a seeded sampler per run cost as much as the run). The loop is
    # traced, not compiled by XLA: a run costs a little more, the compilation far less.
    config = {key: value for key, value in sampler.get_config().items() if key != "seed"}
    sampler = type(sampler)(**config)
    for _ in range(runs):
        ids, stats = speculative.generate(
            target,
            [prompt],
            draft_model=draft,
            draft_tokens=2,
            max_new_tokens=steps,
            sampler=sampler,
            jit_compile=False,
        )
        counts[np.ravel_multi_index(ids[0][len(prompt) :], (6,) * steps)] += 1
        proposed, accepted = proposed + stats.proposed, accepted + stats.accepted
    assert 0.1 < accepted / proposed < 0.9  # both the acceptance and the rejection ran
    assert chi_square_p_value(counts, p) > 1e-3
    if not lookup:
        assert chi_square_p_value(counts, q) < 1e-6


def test_sampling_with_the_draft_under_xla_draws_as_the_graph_does():
    """`jit_compile="draft"` with a sampler: the draft's draws and distributions computed inside
    its XLA calls, the acceptance tests outside; the same noise (a seeded sampler) gives the
    tokens and counts the graph loop gives, over several seeds with both acceptances and
    rejections."""
    target, draft = tiny_lm(1), tiny_lm(2)
    proposed = accepted = 0
    for seed in range(4):
        runs = [
            speculative.generate(
                target,
                [[3]],
                draft_model=draft,
                draft_tokens=2,
                max_new_tokens=6,
                sampler=samplers.RandomSampler(seed=seed),
                jit_compile=jit_compile,
            )
            for jit_compile in (False, "draft")
        ]
        assert runs[0] == runs[1]
        proposed, accepted = proposed + runs[0][1].proposed, accepted + runs[0][1].accepted
    assert 0 < accepted < proposed


def chatml_tokenizer(eos_token="<|im_end|>"):
    backend = tokenizer_files.byte_level_tokenizer("gpt2", 300)
    backend.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return HFTokenizer(backend, chat_template=template, eos_token=eos_token)


def test_chat_with_a_draft_replies_as_without():
    tokenizer = chatml_tokenizer()
    size = tokenizer.vocabulary_size()
    keras.utils.set_random_seed(5)
    lm = kzoo.models.CausalLM(
        kzoo.models.DecoderBackbone.from_preset("llama_tiny", vocabulary_size=size, num_layers=1), tokenizer=tokenizer
    )
    keras.utils.set_random_seed(6)
    backbone = kzoo.models.DecoderBackbone.from_preset(
        "llama_tiny", vocabulary_size=size, num_layers=1, hidden_dim=32, intermediate_dim=64
    )
    small = kzoo.models.CausalLM(backbone, tokenizer=chatml_tokenizer())  # an equal tokenizer, not the same object
    messages = [{"role": "user", "content": "Hi there"}]
    expected = lm.chat(messages, max_new_tokens=6, jit_compile=False)
    assert lm.chat(messages, max_new_tokens=6, jit_compile=False, draft_model=small, draft_tokens=2) == expected
    # A string prompt: the chat's own, as text, to the chat's length and stop tokens (the loops the
    # chats traced serve it), the whole continuation.
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    chat_like = dict(max_length=CHAT_LENGTH_STEP, stop_token_ids=stop_token_ids(tokenizer), jit_compile=False)
    assert lm.generate(text, draft_model=small, draft_tokens=2, **chat_like) == lm.generate(text, **chat_like)
    other = kzoo.models.CausalLM(backbone, tokenizer=chatml_tokenizer(eos_token="<|im_start|>"))
    with pytest.raises(
        ValueError, match=r"`draft_model`'s tokenizer differs from the target's: its end_token_id is 300"
    ):
        lm.chat(messages, max_new_tokens=6, draft_model=other)


def test_bad_drafts_are_refused_naming_the_argument(target, draft):
    prompt = [[7, 3]]
    with pytest.raises(
        ValueError, match=r"`draft_model` must be a kzoo CausalLM or a PromptLookup; received BertBackbone"
    ):
        target.generate(prompt, max_new_tokens=4, draft_model=kzoo.models.BertBackbone.from_preset("bert_tiny"))
    with pytest.raises(ValueError, match=r"`draft_model` must have the target's vocabulary_size \(256\); .* 6"):
        target.generate(prompt, max_new_tokens=4, draft_model=tiny_lm(0))
    short = kzoo.models.CausalLM(kzoo.models.DecoderBackbone.from_preset("llama_tiny", max_sequence_length=16))
    with pytest.raises(ValueError, match=r"`draft_model` has a maximum sequence length of 16, shorter than the 20"):
        target.generate(prompt, max_length=20, draft_model=short)
    with pytest.raises(ValueError, match=r"`draft_model` supports batch size 1 only.* received 2 prompts"):
        target.generate([[7, 3], [5]], max_new_tokens=4, draft_model=draft)
    with pytest.raises(ValueError, match=r"`sampler` cannot be beam search with `draft_model`"):
        target.generate(prompt, max_new_tokens=4, sampler="beam", draft_model=draft)
    for bad in (0, 65, 2.5, True, "4"):
        with pytest.raises(ValueError, match=r"`draft_tokens` must be an int in \[1, 64\]; received"):
            target.generate(prompt, max_new_tokens=4, draft_model=draft, draft_tokens=bad)
    with pytest.raises(ValueError, match=r"`draft_tokens` needs a `draft_model`"):
        target.generate(prompt, max_new_tokens=4, draft_tokens=4)
    with pytest.raises(ValueError, match=r'`jit_compile` must be True, False or "draft"; received \'xla\''):
        target.generate(prompt, max_new_tokens=4, draft_model=draft, jit_compile="xla")
    with pytest.raises(ValueError, match=r'`jit_compile="draft"` compiles a draft model\'s steps; a PromptLookup'):
        target.generate(prompt, max_new_tokens=4, draft_model=kzoo.models.PromptLookup(), jit_compile="draft")
    with pytest.raises(ValueError, match=r"`jit_compile` must be True or False without a `draft_model`; .*'draft'"):
        target.generate(prompt, max_new_tokens=4, jit_compile="draft")


def test_tokenizers_must_match():
    backbone = kzoo.models.DecoderBackbone.from_preset("llama_tiny", vocabulary_size=128)
    lm = kzoo.models.CausalLM(backbone, tokenizer=kzoo.tokenizers.CharacterTokenizer(128))
    fewer = kzoo.models.CausalLM(backbone, tokenizer=kzoo.tokenizers.CharacterTokenizer(100))
    with pytest.raises(
        ValueError, match=r"tokenizer differs from the target's: the draft has 100 tokens, the target 128"
    ):
        lm.generate([[72]], max_new_tokens=2, draft_model=fewer)
    speculative.check_draft_model(lm, kzoo.models.CausalLM(backbone))  # a draft without a tokenizer: ids alone


def test_prompt_lookup_gives_the_targets_own_greedy_output(target):
    """Past its first tokens, the target's greedy output from [7] falls into runs of repeated
    tokens, which copies predict (accepted); its first rounds copy what does not follow
    (rejected) or find nothing (the target runs one position): its own tokens throughout."""
    prompt, length = [7], 40
    expected = target.generate([prompt], max_length=length, jit_compile=False)
    lookup = kzoo.models.PromptLookup(min_ngram_size=1)
    ids, stats = speculate(target, prompt, draft_model=lookup, max_length=length)
    assert ids == expected
    assert 0 < stats.accepted < stats.proposed  # both the acceptance and the rejection ran
    assert stats.target_steps < length - len(prompt)  # rounds that committed more than one token
    # A prompt read partly in rounds (a prefill of four): its tokens, as without a drafter.
    expected = target.generate([SEVEN_TOKENS], max_length=LENGTH, jit_compile=False)
    assert speculate(target, SEVEN_TOKENS, draft_model=lookup)[0] == expected


def test_prompt_lookup_under_xla_gives_the_same_tokens(target):
    expected = target.generate([SEVEN_TOKENS], max_length=LENGTH, jit_compile=False)  # the greedy tests' loop
    assert target.generate([SEVEN_TOKENS], max_length=LENGTH, draft_model=kzoo.models.PromptLookup()) == expected


def test_prompt_lookup_proposes_what_followed_the_suffix_first():
    propose = kzoo.models.PromptLookup(max_ngram_size=3, min_ngram_size=2).propose
    ids = np.array([[1, 2, 3, 4, 9, 1, 2, 0, 0, 0, 0]], "int32")
    # n = 7: the suffix [9, 1, 2] is not seen before, [1, 2] is at 0-1: positions 7.. copy 3, 4, 9, 1, 2.
    proposals, proposed = propose(ids, 7, np.arange(7, 11, dtype="int32"))
    np.testing.assert_array_equal(proposals, [3, 4, 9, 1])
    np.testing.assert_array_equal(proposed, [True] * 4)
    # Positions before n are not asked; a copy past what is known (source >= n) is not proposed.
    proposals, proposed = propose(ids, 7, np.arange(5, 13, dtype="int32"))
    np.testing.assert_array_equal(proposed, [False, False, True, True, True, True, True, False])
    np.testing.assert_array_equal(proposals[2:7], [3, 4, 9, 1, 2])
    # The longest suffix wins over an earlier, shorter one: [4, 1, 2] at 3-5 beats [1, 2] at 0-1.
    ids = np.array([[1, 2, 8, 4, 1, 2, 6, 4, 1, 2, 0, 0]], "int32")
    proposals, proposed = propose(ids, 10, np.arange(10, 12, dtype="int32"))
    np.testing.assert_array_equal(proposals, [6, 4])
    # Nothing seen before (or only the one-token suffix, below min_ngram_size): nothing proposed.
    ids = np.array([[1, 2, 3, 4, 5, 3, 0, 0]], "int32")
    _, proposed = propose(ids, 6, np.arange(6, 8, dtype="int32"))
    np.testing.assert_array_equal(proposed, [False, False])
    proposals, proposed = kzoo.models.PromptLookup(min_ngram_size=1).propose(ids, 6, np.arange(6, 8, dtype="int32"))
    np.testing.assert_array_equal(proposals, [4, 5])
    np.testing.assert_array_equal(proposed, [True, True])


def test_prompt_lookup_settings_are_checked():
    for kwargs, message in (
        ({"max_ngram_size": 0}, r"`max_ngram_size` must be an int in \[1, 16\]; received max_ngram_size=0"),
        ({"max_ngram_size": 17}, r"`max_ngram_size` must be an int in \[1, 16\]"),
        ({"max_ngram_size": 2.0}, r"`max_ngram_size` must be an int"),
        ({"min_ngram_size": 4}, r"`min_ngram_size` must be an int in \[1, 3\]; received min_ngram_size=4"),
        ({"min_ngram_size": True}, r"`min_ngram_size` must be an int in \[1, 3\]"),
    ):
        with pytest.raises(ValueError, match=message):
            kzoo.models.PromptLookup(**kwargs)
