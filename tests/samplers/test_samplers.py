"""Samplers on hand-built toy "models" whose next-token distribution is a table."""

import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from kzoo import samplers

# Token 1 -> 2 (p=.6) or 3 (p=.4); after 2 the mass is spread thin (max .3);
# after 3 comes 4 for sure. Greedy takes 1,2,x (p = .6 * .3 = .18); the best
# sequence is 1,3,4 (p = .4). Token 0 is padding, 5 stops.
TABLE = np.full((6, 6), 1e-6)
TABLE[1, [2, 3]] = [0.6, 0.4]
TABLE[2, [1, 2, 3, 4, 5]] = [0.3, 0.25, 0.2, 0.15, 0.1]
TABLE[3, 4] = 1.0
TABLE[4, 5] = 1.0
TABLE[5, 5] = 1.0
LOGITS = np.log(TABLE / TABLE.sum(-1, keepdims=True)).astype("float32")


def toy_step(token, cache, index):
    """Logits depend on the fed token only; the cache counts the steps."""
    return ops.take(LOGITS, token[:, 0], axis=0), cache + 1


def decode(sampler, prompts, length=4, stop_token_ids=()):
    noise = sampler.noise(length, len(prompts))
    ids, generated = decode_tensors(sampler, prompts, length, noise, stop_token_ids)
    return ops.convert_to_numpy(ids), ops.convert_to_numpy(generated)


def decode_tensors(sampler, prompts, length, noise, stop_token_ids=()):
    token_ids = np.zeros((len(prompts), length), "int32")
    prompt_mask = np.zeros((len(prompts), length), bool)
    for row, prompt in enumerate(prompts):
        token_ids[row, : len(prompt)] = prompt
        prompt_mask[row, : len(prompt)] = True
    start = min(len(p) for p in prompts)
    logits = ops.take(LOGITS, token_ids[:, start - 1], axis=0)
    cache = ops.zeros((len(prompts), 1))
    return sampler.run(
        toy_step,
        ops.convert_to_tensor(token_ids),
        prompt_mask=ops.convert_to_tensor(prompt_mask),
        logits=logits,
        cache=cache,
        index=start,
        stop_token_ids=ops.convert_to_tensor(np.array(stop_token_ids, "int32")),
        noise=noise,
    )


def test_greedy_takes_the_argmax_and_beam_search_finds_the_better_sequence():
    greedy, _ = decode(samplers.GreedySampler(), [[1]], length=3)
    assert greedy.tolist() == [[1, 2, 1]]
    beam, generated = decode(samplers.BeamSampler(num_beams=2, length_penalty=0.0), [[1]], length=3)
    assert beam.tolist() == [[1, 3, 4]]
    assert generated.tolist() == [[False, True, True]]


def test_top_k_one_and_beam_width_one_equal_greedy():
    prompts = [[1], [2, 4], [3]]
    want, _ = decode(samplers.GreedySampler(), prompts, length=5)
    for sampler in (samplers.TopKSampler(k=1, seed=3), samplers.BeamSampler(num_beams=1)):
        np.testing.assert_array_equal(decode(sampler, prompts, length=5)[0], want)


def test_ragged_prompts_in_one_batch_equal_each_row_alone():
    prompts = [[1], [2, 4, 5], [3, 4]]
    for sampler in (samplers.GreedySampler(), samplers.BeamSampler(num_beams=3)):
        together, _ = decode(sampler, prompts, length=6)
        for row, prompt in enumerate(prompts):
            np.testing.assert_array_equal(together[row], decode(sampler, [prompt], length=6)[0][0])


def test_stop_token_ends_a_row_and_pads_the_rest():
    ids, generated = decode(samplers.GreedySampler(), [[3], [1]], length=6, stop_token_ids=[5])
    assert ids[0].tolist() == [3, 4, 5, 0, 0, 0]
    assert generated[0].tolist() == [False, True, True, False, False, False]
    assert ids[1].tolist() == [1, 2, 1, 2, 1, 2]


def test_seeded_random_sampling_is_reproducible_and_follows_the_distribution():
    sampler = samplers.RandomSampler(seed=7)
    first, _ = decode(sampler, [[2]] * 400, length=2)
    again, _ = decode(samplers.RandomSampler(seed=7), [[2]] * 400, length=2)
    np.testing.assert_array_equal(first, again)
    frequencies = np.bincount(first[:, 1], minlength=6)[1:] / 400
    np.testing.assert_allclose(frequencies, [0.3, 0.25, 0.2, 0.15, 0.1], atol=0.06)


def test_top_k_and_top_p_only_draw_from_their_sets():
    top_k, _ = decode(samplers.TopKSampler(k=2, seed=1), [[2]] * 300, length=2)
    assert set(top_k[:, 1]) == {1, 2}
    top_p, _ = decode(samplers.TopPSampler(p=0.7, seed=1), [[2]] * 300, length=2)
    assert set(top_p[:, 1]) == {1, 2, 3}  # .3 + .25 < .7 <= .3 + .25 + .2


def test_the_loop_compiles_with_xla():
    sampler = samplers.TopPSampler(p=0.9, seed=2)
    noise = sampler.noise(5, 2)  # drawn outside: XLA's stateless RNG differs from TF's
    compiled = tf.function(lambda n: decode_tensors(sampler, [[1], [3]], 5, n), jit_compile=True)
    eager = decode_tensors(sampler, [[1], [3]], 5, noise)
    np.testing.assert_array_equal(ops.convert_to_numpy(compiled(noise)[0]), ops.convert_to_numpy(eager[0]))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: samplers.get("nucleus"), r"`sampler` must be one of \['beam', 'greedy', 'random', 'top_k', 'top_p'\]"),
        (lambda: samplers.TopPSampler(p=0.0), r"`p` must be a finite number in \(0, 1\]; received p=0.0"),
        (lambda: samplers.TopPSampler(p=1.5), r"`p` must be a finite number in \(0, 1\]"),
        (lambda: samplers.TopPSampler(p=float("nan")), r"`p` must be a finite number in \(0, 1\]; received p=nan"),
        (lambda: samplers.TopPSampler(p="0.9"), r"`p` must be a finite number in \(0, 1\]; received p='0.9'"),
        (lambda: samplers.TopKSampler(k=0), r"`k` must be a positive integer"),
        (lambda: samplers.TopKSampler(k=2.0), r"`k` must be a positive integer; received k=2.0"),
        (lambda: samplers.TopKSampler(k=True), r"`k` must be a positive integer; received k=True"),
        (lambda: samplers.RandomSampler(temperature=0), r"`temperature` must be a finite number in \(0, inf\)"),
        (lambda: samplers.RandomSampler(temperature="0.5"), r"received temperature='0.5'"),
        (lambda: samplers.TopKSampler(temperature=float("inf")), r"received temperature=inf"),
        (lambda: samplers.TopPSampler(temperature=None), r"received temperature=None"),
        (lambda: samplers.RandomSampler(seed=1.5), r"`seed` must be None or an integer in \[-2\*\*63, 2\*\*63\)"),
        (lambda: samplers.TopKSampler(seed="0"), r"received seed='0'"),
        (lambda: samplers.TopPSampler(seed=2**64), r"received seed=18446744073709551616"),
        (lambda: samplers.BeamSampler(num_beams=0), r"`num_beams` must be a positive integer"),
        (lambda: samplers.BeamSampler(num_beams="4"), r"`num_beams` must be a positive integer; received num_beams='4"),
        (lambda: samplers.BeamSampler(length_penalty=float("nan")), r"`length_penalty` must be a finite number in "
         r"\(-inf, inf\); received length_penalty=nan"),
        (lambda: samplers.BeamSampler(length_penalty="1"), r"received length_penalty='1'"),
    ],
)  # fmt: skip
def test_bad_sampler_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_numpy_numbers_are_good_arguments_and_stored_as_python_ones():
    sampler = samplers.TopKSampler(k=np.int32(3), temperature=np.float32(0.5), seed=np.int64(7))
    assert sampler.get_config() == {"temperature": 0.5, "seed": 7, "k": 3}
    assert all(type(value) in (int, float) for value in sampler.get_config().values())
