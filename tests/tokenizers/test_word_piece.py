"""keras-hub tokenizers: reserved ids, vocabulary fitting, save and load."""

import pytest
import tensorflow as tf

from kzoo.data import SPECIAL_TOKENS
from kzoo.data import character_tokenizer
from kzoo.data import load_tokenizer
from kzoo.data import save_tokenizer
from kzoo.data import train_word_piece_vocabulary
from kzoo.data import word_piece_tokenizer
from kzoo.tokenizers import word_piece

TEXTS = ["The cat sat on the mat.", "The hat is on the cat.", "Cats sit."]


def test_special_token_ids_are_fixed():
    assert SPECIAL_TOKENS == ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[BOS]", "[EOS]")
    ids = (
        word_piece.PAD_ID,
        word_piece.UNK_ID,
        word_piece.CLS_ID,
        word_piece.SEP_ID,
        word_piece.MASK_ID,
        word_piece.BOS_ID,
        word_piece.EOS_ID,
    )
    assert ids == (0, 1, 2, 3, 4, 5, 6)


def test_word_piece_vocabulary_starts_with_the_special_tokens():
    vocabulary = train_word_piece_vocabulary(tf.data.Dataset.from_tensor_slices(TEXTS), 60)
    assert vocabulary[: len(SPECIAL_TOKENS)] == list(SPECIAL_TOKENS)
    assert vocabulary == train_word_piece_vocabulary(TEXTS, 60)
    tokenizer = word_piece_tokenizer(vocabulary)
    assert [tokenizer.token_to_id(token) for token in SPECIAL_TOKENS] == list(range(7))
    assert tokenizer.detokenize(tokenizer("The cat sat.")) == "The cat sat ."
    assert tokenizer("zebra").tolist() == [word_piece.UNK_ID]


def test_lowercase_vocabulary():
    tokenizer = word_piece_tokenizer(train_word_piece_vocabulary(TEXTS, 60, lowercase=True), lowercase=True)
    assert tokenizer("THE CAT").tolist() == tokenizer("the cat").tolist()


def test_a_vocabulary_without_the_special_tokens_is_refused():
    with pytest.raises(ValueError, match=r"must start with kzoo's special tokens"):
        word_piece_tokenizer(["[UNK]", "the", "cat"])


def test_word_piece_save_and_load(tmp_path):
    tokenizer = word_piece_tokenizer(train_word_piece_vocabulary(TEXTS, 60, lowercase=True), lowercase=True)
    save_tokenizer(tokenizer, tmp_path / "model")
    lines = (tmp_path / "model" / "vocabulary.txt").read_text(encoding="utf-8").splitlines()
    assert lines == tokenizer.get_vocabulary()
    restored = load_tokenizer(tmp_path / "model")
    assert restored.get_vocabulary() == tokenizer.get_vocabulary()
    assert restored.lowercase
    assert restored("The CATS sat").tolist() == tokenizer("The CATS sat").tolist()


def test_character_tokenizer_is_code_points_and_round_trips(tmp_path):
    tokenizer = character_tokenizer()
    text = "First Citizen:\nSpeak, speak."
    ids = tokenizer(text)
    assert ids.tolist() == [ord(c) for c in text]
    assert tokenizer.detokenize(ids) == text
    assert tokenizer("é").tolist() == [26]  # outside the vocabulary: the unknown id (ASCII SUB)
    save_tokenizer(tokenizer, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.json"]
    restored = load_tokenizer(tmp_path)
    assert restored.vocabulary_size() == 128 and restored(text).tolist() == ids.tolist()


def test_load_without_a_saved_tokenizer(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
