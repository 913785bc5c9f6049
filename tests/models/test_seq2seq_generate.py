"""`Seq2SeqTransformer.generate`: cached decoding against the teacher-forced model.

The tests trace the loop as a TensorFlow graph (`jit_compile=False`); one test checks that
`generate`'s XLA default gives the same tokens. Tracing the loop is most of their time, and each
source length is traced again: the tests share the sources and the length, and the module's
fixtures decode each source alone once.
"""

import keras
import numpy as np
import pytest

from kzoo import models
from kzoo import samplers

START = 1
# Ragged: a row of one token, and padding under two of the three rows in a batch.
SOURCES = [[4, 9, 2], [7], [3, 3, 8, 12, 5]]
LENGTH = 8


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


@pytest.fixture(scope="module")
def greedy_alone(model):
    """The greedy target of each of SOURCES, decoded alone."""
    return [model.generate([s], START, max_length=LENGTH, jit_compile=False)[0] for s in SOURCES]


@pytest.fixture(scope="module")
def beams_alone(model):
    """The beam search target (3 beams) of each of SOURCES, decoded alone, its source padded to the
    longest: one shape, traced once (the greedy rows show that padding changes nothing; what the
    beams add is rows of several beams each in one batch)."""
    beam = samplers.BeamSampler(num_beams=3)
    width = max(map(len, SOURCES))
    return [
        model.generate([s + [0] * (width - len(s))], START, max_length=LENGTH, sampler=beam, jit_compile=False)[0]
        for s in SOURCES
    ]


def teacher_forced_argmax(model, source, target):
    """The teacher-forced model's argmax after each prefix of `target`, in one pass (its decoder
    is causal: position t sees `target[: t + 1]` only)."""
    logits = np.asarray(model({"encoder_token_ids": np.array([source]), "decoder_token_ids": np.array([target])}))
    return logits[0].argmax(-1).tolist()


def test_cached_greedy_equals_the_teacher_forced_reference(model, greedy_alone):
    # Every token is the argmax of the full model over the tokens before it: greedy decoding.
    for source, target in zip(SOURCES, greedy_alone):
        assert len(target) == LENGTH and target[0] == START
        assert target[1:] == teacher_forced_argmax(model, source, target)[:-1]


def test_ragged_sources_and_beams_in_one_batch_equal_each_row_alone(model, greedy_alone, beams_alone):
    assert model.generate(SOURCES, START, max_length=LENGTH, jit_compile=False) == greedy_alone
    beam = samplers.BeamSampler(num_beams=3)
    assert model.generate(SOURCES, START, max_length=LENGTH, sampler=beam, jit_compile=False) == beams_alone


def test_beam_width_one_equals_greedy_and_stop_tokens_end_rows(model, greedy_alone):
    # The sources as a padded array (a dict comes back).
    sources = np.array([s + [0] * (5 - len(s)) for s in SOURCES])
    beam = model.generate(
        sources, START, max_length=LENGTH, sampler=samplers.BeamSampler(num_beams=1), jit_compile=False
    )
    assert [row[mask].tolist() for row, mask in zip(beam["token_ids"], beam["padding_mask"])] == greedy_alone
    stop = greedy_alone[0][2]
    stopped = model.generate(SOURCES, START, max_length=LENGTH, stop_token_ids=[stop], jit_compile=False)
    assert stopped[0][-1] == stop
    for row, alone in zip(stopped, greedy_alone):
        assert row == (alone[: alone.index(stop, 1) + 1] if stop in alone[1:] else alone)


def test_the_xla_loop_gives_the_tokens_of_the_traced_loop(model, greedy_alone, beams_alone):
    # Against each row traced alone (the ragged test shows the traced batch gives the same).
    assert model.generate(SOURCES, START, max_length=LENGTH) == greedy_alone
    assert model.generate(SOURCES, START, max_length=LENGTH, sampler=samplers.BeamSampler(num_beams=3)) == beams_alone


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
