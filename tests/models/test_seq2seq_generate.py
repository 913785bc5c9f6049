"""`Seq2SeqTransformer.generate`: cached decoding against the teacher-forced model.

The tests trace the loop as a TensorFlow graph (`jit_compile=False`); one test checks that
`generate`'s XLA default gives the same tokens.
"""

import keras
import numpy as np
import pytest

from kzoo import models
from kzoo import samplers

START = 1


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(3)
    backbone = models.Seq2SeqBackbone(
        vocabulary_size=30,
        num_encoder_layers=1,
        num_decoder_layers=2,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=12,
        dropout=0.0,
    )
    seq2seq = models.Seq2SeqTransformer(backbone)
    seq2seq.set_weights([w * 3 for w in seq2seq.get_weights()])  # no argmax ties
    return seq2seq


def naive_greedy(model, source, length):
    """Recomputes the whole target prefix through the teacher-forced model each step."""
    target = [START]
    while len(target) < length:
        logits = np.asarray(model({"encoder_token_ids": np.array([source]), "decoder_token_ids": np.array([target])}))
        target.append(int(logits[0, -1].argmax()))
    return target


def test_cached_greedy_equals_the_teacher_forced_reference(model):
    for source in ([4, 9, 2], [7], [3, 3, 8, 12, 5]):
        assert model.generate([source], START, max_length=9, jit_compile=False) == [naive_greedy(model, source, 9)]


def test_ragged_sources_and_beams_in_one_batch_equal_each_row_alone(model):
    sources = [[4, 9, 2], [7], [3, 3, 8, 12, 5]]
    for sampler in ("greedy", samplers.BeamSampler(num_beams=3)):
        together = model.generate(sources, START, max_length=8, sampler=sampler, jit_compile=False)
        assert together == [
            model.generate([s], START, max_length=8, sampler=sampler, jit_compile=False)[0] for s in sources
        ]


def test_beam_width_one_equals_greedy_and_stop_tokens_end_rows(model):
    sources = np.array([[4, 9, 2], [7, 0, 0]])
    greedy = model.generate(sources, START, max_length=9, jit_compile=False)
    beam = model.generate(sources, START, max_length=9, sampler=samplers.BeamSampler(num_beams=1), jit_compile=False)
    np.testing.assert_array_equal(beam["token_ids"], greedy["token_ids"])
    row = greedy["token_ids"][0].tolist()
    stop = row[2]
    stopped = model.generate([[4, 9, 2]], START, max_length=9, stop_token_ids=[stop], jit_compile=False)[0]
    assert stopped == row[: row.index(stop, 1) + 1]


def test_the_xla_loop_gives_the_tokens_of_the_traced_loop(model):
    sources = [[4, 9, 2], [7]]
    for sampler in ("greedy", samplers.BeamSampler(num_beams=2)):
        xla = model.generate(sources, START, max_length=8, sampler=sampler)
        assert xla == model.generate(sources, START, max_length=8, sampler=sampler, jit_compile=False), sampler


@pytest.mark.parametrize(
    "sources, kwargs, match",
    [
        ([[]], {}, r"`encoder_token_ids` must hold at least one non-padding token"),
        ([list(range(1, 14))], {}, r"source length \(13\) must be <= the model's maximum sequence length \(12\)"),
        ([[4]], {"max_length": 13}, r"`max_length` \(13\) must be <="),
        ([[4]], {"sampler": "top_p", "max_length": 4, "max_new_tokens": 2}, r"not both"),
    ],
)
def test_bad_generate_arguments(model, sources, kwargs, match):
    with pytest.raises(ValueError, match=match):
        model.generate(sources, START, **kwargs)
