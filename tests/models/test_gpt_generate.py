"""`GPTCausalLM.generate`: the cache, the samplers, ragged batches, compilation.

The tests trace the loop as a TensorFlow graph (`jit_compile=False`), the same code that
`generate`'s XLA default compiles, in a fraction of the time; one test checks that XLA gives
the same tokens. Tracing is most of their time, once per batch size, length and prefill: the
tests share PROMPTS and LENGTH, and the module's fixtures decode each prompt alone once.
"""

import numpy as np
import pytest

from kzoo import models
from kzoo import samplers
from kzoo.models import generation
from tests.models.tiny_models import gpt_backbone

# Ragged: prompts of 1, 2, 3 and 7 tokens (prefills of 1, 2 and 4 positions).
PROMPTS = [[5], [7, 3, 9], [1, 2, 3, 4, 5, 6, 7], [9, 9]]
LENGTH = 16
BEAM_LENGTH = 12


@pytest.fixture(scope="module")
def lm():
    # Larger logits than the default init make argmax ties impossible.
    import keras

    keras.utils.set_random_seed(5)
    model = models.GPTCausalLM(gpt_backbone(max_sequence_length=16))
    model.set_weights([w * 3 for w in model.get_weights()])
    return model


@pytest.fixture(scope="module")
def greedy_alone(lm):
    """The greedy continuation of each of PROMPTS to LENGTH, decoded alone."""
    return [lm.generate([p], max_length=LENGTH, jit_compile=False)[0] for p in PROMPTS]


@pytest.fixture(scope="module")
def beams_alone(lm):
    """The beam search continuation (3 beams) of each of PROMPTS to BEAM_LENGTH, decoded alone."""
    beam = samplers.BeamSampler(num_beams=3)
    return [lm.generate([p], max_length=BEAM_LENGTH, sampler=beam, jit_compile=False)[0] for p in PROMPTS]


def uncached_argmax(lm, ids):
    """The reference without a cache: the argmax after each prefix of `ids`, from one pass of the
    whole sequence through the model (causal: position t sees `ids[: t + 1]` only)."""
    x = np.array([ids], "int32")
    return np.asarray(lm({"token_ids": x, "padding_mask": np.ones_like(x)}))[0].argmax(-1).tolist()


def test_cached_greedy_equals_recomputing_the_whole_prefix(lm, greedy_alone):
    # Every new token is the argmax of the model over the whole prefix before it.
    for prompt, ids in zip(PROMPTS, greedy_alone):
        assert len(ids) == LENGTH and ids[: len(prompt)] == prompt
        assert ids[len(prompt) :] == uncached_argmax(lm, ids)[len(prompt) - 1 : -1]


def test_ragged_prompts_in_one_batch_equal_each_row_alone(lm, greedy_alone, beams_alone):
    assert lm.generate(PROMPTS, max_length=LENGTH, jit_compile=False) == greedy_alone
    beams = lm.generate(PROMPTS, max_length=BEAM_LENGTH, sampler=samplers.BeamSampler(num_beams=3), jit_compile=False)
    assert beams == beams_alone


def test_top_k_one_and_beam_width_one_equal_greedy(lm, greedy_alone):
    top_k = samplers.TopKSampler(k=1, seed=4)
    assert lm.generate(PROMPTS, max_length=LENGTH, sampler=top_k, jit_compile=False) == greedy_alone
    beam = samplers.BeamSampler(num_beams=1)
    assert lm.generate(PROMPTS, max_length=LENGTH, sampler=beam, jit_compile=False) == greedy_alone


def test_beam_search_scores_at_least_as_high_as_greedy(lm, greedy_alone, beams_alone):
    def log_prob(ids, prompt_length):
        x = np.array([ids], "int32")
        logits = np.asarray(lm({"token_ids": x, "padding_mask": np.ones_like(x)}), "float64")[0]
        shifted = logits - logits.max(-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        return sum(log_probs[t - 1, ids[t]] for t in range(prompt_length, len(ids)))

    # No stop tokens: every beam is BEAM_LENGTH long, so the length penalty ranks them as their
    # log-probabilities do. Greedy to BEAM_LENGTH is greedy to LENGTH cut there.
    for prompt, greedy, beam in zip(PROMPTS, greedy_alone, beams_alone):
        assert log_prob(beam, len(prompt)) >= log_prob(greedy[:BEAM_LENGTH], len(prompt)) - 1e-5


def test_stop_token_ends_each_row(lm, greedy_alone):
    free = greedy_alone  # each row alone is what the batch gives (the ragged test)
    stop = free[0][3]  # the third generated token of row 0
    stopped = lm.generate(PROMPTS, max_length=LENGTH, stop_token_ids=[stop], jit_compile=False)
    assert stopped[0][-1] == stop
    for prompt, row, free_row in zip(PROMPTS, stopped, free):
        new = free_row[len(prompt) :]
        assert row == (free_row[: len(prompt) + new.index(stop) + 1] if stop in new else free_row)


def test_seeded_sampling_is_reproducible_and_dict_inputs_are_padded(lm):
    prompts = {"token_ids": np.array([[5, 6, 0], [7, 3, 9]]), "padding_mask": np.array([[1, 1, 0], [1, 1, 1]])}
    a = lm.generate(prompts, max_length=12, sampler=samplers.TopPSampler(p=0.9, seed=11), jit_compile=False)
    b = lm.generate(prompts, max_length=12, sampler=samplers.TopPSampler(p=0.9, seed=11), jit_compile=False)
    np.testing.assert_array_equal(a["token_ids"], b["token_ids"])
    assert a["token_ids"].shape == (2, 12) and a["padding_mask"].all()
    np.testing.assert_array_equal(a["token_ids"][:, :2], [[5, 6], [7, 3]])


def test_the_xla_loop_gives_the_tokens_of_the_traced_loop(lm, greedy_alone, beams_alone):
    # The two loops, greedy's (every sampler's but beam search's) and beam search's, against each
    # row traced alone (the ragged test shows the traced batch gives the same). Each compilation
    # takes seconds: the sampled draws under XLA are checked on a table "model"
    # (tests/samplers/test_samplers.py::test_the_loop_compiles_with_xla).
    assert lm.generate(PROMPTS, max_length=LENGTH) == greedy_alone
    beam = samplers.BeamSampler(num_beams=3)
    assert lm.generate(PROMPTS, max_length=BEAM_LENGTH, sampler=beam) == beams_alone


def test_the_decode_loop_is_traced_once_per_shape(lm):
    lm.generate([[1, 2], [3, 4]], max_length=9, sampler="top_k", jit_compile=False)
    lm.generate([[4, 2], [1, 4]], max_length=9, sampler=samplers.TopKSampler(seed=2), jit_compile=False)
    lm.generate([[4, 2, 7], [1, 4, 2]], max_length=9, sampler="top_k", jit_compile=False)  # same prefill bucket (2)
    compiled = [f for key, f in generation._COMPILED[lm].items() if key[:2] == (2, 9) and key[3][0] == "TopKSampler"]
    assert len(compiled) == 1 and compiled[0].experimental_get_tracing_count() == 1


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(prompts=[[]]), r"prompt 0 of `prompts` is empty"),
        (dict(prompts=[]), r"`prompts` is empty"),
        (
            dict(prompts=[[1], list(range(1, 17))]),
            r"Prompt 1 of `prompts` has 16 tokens, which leaves no room to generate within the model's maximum "
            r"sequence length \(16\): a prompt must have fewer than 16 tokens.",
        ),
        (dict(prompts=[[1, 2]], max_length=2), r"`max_length` \(2\) must be > 2"),
        (
            dict(prompts=[[1]], max_length=17),
            r"`max_length` \(17\) must be <= the model's maximum sequence length \(16\)",
        ),
        (
            dict(prompts=[[1, 2], [3]], max_new_tokens=15),
            r"`max_new_tokens` must be <= 14: the longest prompt has 2 tokens and the model's maximum sequence length "
            r"is 16; received max_new_tokens=15.",
        ),
        (dict(prompts=[[1]], sampler="nucleus"), r"`sampler` must be one of"),
        (dict(prompts=[[1]], sampler="top_p", max_length=4, max_new_tokens=2), r"not both"),
    ],
)
def test_bad_generate_arguments(lm, kwargs, match):
    with pytest.raises(ValueError, match=match):
        lm.generate(**kwargs)
