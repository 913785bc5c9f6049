"""CharacterTokenizer: code points below the vocabulary size, the unknown id for the rest."""

import keras_hub
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from kzoo import data
from kzoo.data import CharacterTokenizer


def test_characters_outside_the_vocabulary_become_the_unknown_id_not_the_last_character():
    tokenizer = data.character_tokenizer(128)
    assert np.asarray(tokenizer("a😀é\x7f")).tolist() == [97, 26, 26, 127]
    assert np.asarray(CharacterTokenizer(256)("é😀ÿ")).tolist() == [233, 26, 255]
    # keras-hub's tokenizer, which kzoo used before, clamps the emoji to a real character: 'ÿ'.
    clamping = keras_hub.tokenizers.UnicodeCodepointTokenizer(vocabulary_size=256, lowercase=False)
    assert np.asarray(clamping("😀")).tolist() == [255]
    assert CharacterTokenizer(128, unknown_id=127)("😀").tolist() == [127]


def test_the_graph_path_maps_as_python_does():
    tokenizer = data.character_tokenizer(128)
    texts = ["Hi 😀", "", "\U0010ffff\x00z"]
    ragged = tf.data.Dataset.from_tensor_slices([texts]).map(tokenizer).get_single_element()
    assert ragged.to_list() == [[72, 105, 32, 26], [], [26, 0, 122]] == [list(tokenizer(t)) for t in texts]
    dense = tf.function(lambda t: tokenizer(t))(tf.constant("a😀"))
    assert dense.numpy().tolist() == [97, 26]


@settings(max_examples=50, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=127, exclude_characters="\x00"), max_size=40))
def test_ascii_round_trips(text):
    tokenizer = data.character_tokenizer(128)
    ids = np.asarray(tokenizer(text)).tolist()
    assert ids == [ord(c) for c in text] and tokenizer.detokenize(ids) == text


def test_unknown_id_detokenizes_as_the_substitute_character_and_saves(tmp_path):
    tokenizer = data.character_tokenizer(128)
    assert tokenizer.detokenize([72, 26, 0]) == "H\x1a"
    data.save_tokenizer(tokenizer, tmp_path)
    loaded = data.load_tokenizer(tmp_path)
    assert type(loaded) is CharacterTokenizer and loaded.vocabulary_size() == 128 and loaded.unknown_id == 26
    assert np.asarray(loaded("😀a")).tolist() == [26, 97]


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(vocabulary_size=1), "`vocabulary_size` must be in"),
        (dict(vocabulary_size=128, unknown_id=128), "`unknown_id` must be in"),
    ],
)
def test_bad_arguments(arguments, message):
    with pytest.raises(ValueError, match=message):
        CharacterTokenizer(**arguments)
