"""tokenizer.json writers: the Hugging Face tokenizer gives the keras-hub tokenizer's ids and text."""

import keras_hub
import numpy as np
import pytest
import tokenizers
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from kzoo import data
from kzoo.data.tokenizer_json import hugging_face_tokenizer

CHARACTER_TOKENIZERS = {
    "kzoo 128": lambda: data.character_tokenizer(128),
    "kzoo 256": lambda: data.CharacterTokenizer(256),
    "keras-hub clamping 128": lambda: keras_hub.tokenizers.UnicodeCodepointTokenizer(vocabulary_size=128, lowercase=False),
}


@pytest.mark.parametrize("name", CHARACTER_TOKENIZERS)
@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=30), ids=st.lists(st.integers(0, 127), max_size=30))
def test_character_tokenizers_agree_with_keras(name, text, ids):
    tokenizer = CHARACTER_TOKENIZERS[name]()
    exported = hugging_face_tokenizer(tokenizer)
    # Through the tokenizer.json text, as a runtime reads it.
    loaded = tokenizers.Tokenizer.from_str(exported.tokenizer.to_str())
    assert loaded.encode(text).ids == np.asarray(tokenizer(text)).tolist()
    assert loaded.decode(ids) == tokenizer.detokenize(ids)


def test_character_bundle_tokens():
    exported = hugging_face_tokenizer(data.character_tokenizer(128))
    assert exported.start_token_id is None and exported.stop_token_ids == [0]
    assert exported.tokenizer.get_vocab_size() == 128
    assert exported.tokenizer.encode("line\nbreak 😀").ids == [108, 105, 110, 101, 10, 98, 114, 101, 97, 107, 32, 26]


def test_unsupported_tokenizers_are_refused():
    word_pieces = data.word_piece_tokenizer(list(data.SPECIAL_TOKENS) + ["the", "cat"])
    with pytest.raises(ValueError, match="No tokenizer.json writer for a WordPieceTokenizer"):
        hugging_face_tokenizer(word_pieces)
    lowercase = keras_hub.tokenizers.UnicodeCodepointTokenizer(vocabulary_size=128, lowercase=True)
    with pytest.raises(ValueError, match="lowercase"):
        hugging_face_tokenizer(lowercase)
