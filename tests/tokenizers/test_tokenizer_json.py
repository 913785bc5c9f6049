"""tokenizer.json writers: the Hugging Face tokenizer gives the keras-hub tokenizer's ids and text."""

import json
import lzma

import keras_hub
import numpy as np
import pytest
import tensorflow as tf
import tokenizers
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from kzoo import data
from kzoo.checkpoints.hf.tokenizer_files import read_llama_tokenizer
from kzoo.tokenizers.bert import BertTokenizer
from kzoo.tokenizers.hugging_face import HFTokenizer
from kzoo.tokenizers.tokenizer_json import hugging_face_tokenizer
from kzoo.tokenizers.word_piece import SEP_ID
from kzoo.tokenizers.word_piece import UNK_ID
from tests.models import tokenizer_files

CHARACTER_TOKENIZERS = {
    "kzoo 128": lambda: data.character_tokenizer(128),
    "kzoo 256": lambda: data.CharacterTokenizer(256),
    "keras-hub clamping 128": lambda: keras_hub.tokenizers.UnicodeCodepointTokenizer(
        vocabulary_size=128, lowercase=False
    ),
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


# Real sentences with accents, punctuation, emoji, CJK, odd spacing and special tokens in the text.
SENTENCES = [
    "¿Dónde está la estación? ¡Vamos ya!",
    "Café crème brûlée, déjà vu; naïve coöperation.",
    "I've got 12345 apples (and 3.5 pears)...",
    "emoji 😀 👍🏽 ok ❤️!",
    "中文字符 日本語のテキスト 한국어",
    "  two  spaces\n\nnew lines\t and a tab  ",
    "it's THEY'RE we'll \"quoted\" 'single'",
    "how are you ? [SEP]",
    "a[SEP]b [EOS] [MASK]x",
    "soft\u00adhyphen zero\u200bwidth",
    "Straße ΣΊΣΥΦΟΣ",
]


@pytest.fixture(scope="module")
def spa_eng():
    """The English and Spanish texts of the first 1,000 pairs: the vocabularies are fitted on them
    (keras-hub's learner takes seconds per thousand texts) and the agreement checked on 80."""
    lines = _read_xz(data.corpus_dir() / "spa-eng" / "spa.txt.xz").splitlines()
    return [text for line in lines[:1000] for text in line.split("\t")[:2]]


@pytest.fixture(scope="module")
def word_piece_vocabularies(spa_eng):
    return {lowercase: data.train_word_piece_vocabulary(spa_eng, 800, lowercase) for lowercase in (False, True)}


def check_agreement(tokenizer, texts):
    """The written tokenizer.json, read back from a file, gives the Keras tokenizer's ids, eager
    and in a TensorFlow graph, and decodes ids to the Keras tokenizer's text.

    Keras tokenizes the texts as one batch, eager and in the graph (each row alone, as a serving
    signature's batch of strings is): a call per text took up to seconds each, eagerly, in
    keras-hub's byte-level BPE (which traces its merges anew in each call that meets new words)
    and kzoo's BertTokenizer. The first text is also tokenized alone, a string, not a batch."""
    exported = hugging_face_tokenizer(tokenizer)
    loaded = tokenizers.Tokenizer.from_str(exported.tokenizer.to_str())
    eager = [np.asarray(ids).tolist() for ids in tokenizer(texts)]
    graph = tf.function(lambda text: tokenizer(text))(tf.constant(texts)).to_list()
    decoded = tokenizer.detokenize(eager)
    for text, ids, graph_ids, keras_text in zip(texts, eager, graph, decoded, strict=True):
        assert loaded.encode(text).ids == ids == graph_ids, text
        assert loaded.decode(ids, skip_special_tokens=False) == str(keras_text), text
    assert np.asarray(tokenizer(texts[0])).tolist() == eager[0]
    assert str(tokenizer.detokenize(eager[0])) == str(decoded[0])
    return exported, loaded


WORD_PIECE_TOKENIZERS = {
    # the recipes' tokenizers (cased: gpt_translate, seq2seq_translate, bert_tag)
    "kzoo cased": lambda vocabulary: data.word_piece_tokenizer(vocabulary[False]),
    "keras-hub, special tokens spelled out": lambda vocabulary: keras_hub.tokenizers.WordPieceTokenizer(
        vocabulary[False]
    ),
    "keras-hub, strip accents": lambda vocabulary: keras_hub.tokenizers.WordPieceTokenizer(
        vocabulary[True], strip_accents=True, split_on_cjk=False
    ),
    "BertTokenizer uncased": lambda vocabulary: BertTokenizer(vocabulary[True]),
    "BertTokenizer cased": lambda vocabulary: BertTokenizer(vocabulary[False], lowercase=False),
    "BertTokenizer lowercase, accents kept": lambda vocabulary: BertTokenizer(vocabulary[True], strip_accents=False),
}


@pytest.mark.parametrize("name", WORD_PIECE_TOKENIZERS)
def test_word_piece_tokenizers_agree_with_keras(name, word_piece_vocabularies, spa_eng):
    tokenizer = WORD_PIECE_TOKENIZERS[name](word_piece_vocabularies)
    check_agreement(tokenizer, SENTENCES + spa_eng[1:2000:25])


def test_word_piece_lowercase_agrees_on_real_text(word_piece_vocabularies, spa_eng):
    """keras-hub's lowercasing is case folding, which the writer approximates (module docstring):
    equal on real text, and on the documented differences it differs as written there."""
    tokenizer = data.word_piece_tokenizer(word_piece_vocabularies[True], lowercase=True)
    _, loaded = check_agreement(tokenizer, [text for text in SENTENCES if "…" not in text] + spa_eng[1:2000:25])
    # U+00A0 is a space after NFKC: split by the written tokenizer, kept in the word by keras-hub.
    assert np.asarray(tokenizer("a\u00a0b")).tolist() == [UNK_ID] != loaded.encode("a\u00a0b").ids


def test_word_piece_unknown_words_are_unk(word_piece_vocabularies):
    tokenizer = data.word_piece_tokenizer(word_piece_vocabularies[False])
    loaded = tokenizers.Tokenizer.from_str(hugging_face_tokenizer(tokenizer).tokenizer.to_str())
    # A word WordPiece cannot spell (an emoji, a script not in the vocabulary) is one [UNK] in both.
    text = "la 😀 Ωμέγα"
    expected = [tokenizer.token_to_id("la"), UNK_ID, UNK_ID]
    assert loaded.encode(text).ids == np.asarray(tokenizer(text)).tolist() == expected
    # Special tokens written in the text are kept whole: a translation prompt can be written as text.
    assert loaded.encode("la [SEP]").ids == np.asarray(tokenizer("la [SEP]")).tolist() == [expected[0], SEP_ID]
    # Words over 100 characters are [UNK] in both.
    assert loaded.encode("a" * 101).ids == np.asarray(tokenizer("a" * 101)).tolist() == [UNK_ID]


@pytest.fixture(scope="module")
def gpt2_tokenizer():
    """A GPT-2 tokenizer (keras-hub's) over a byte-level BPE that `tokenizers` fits on Shakespeare."""
    text = _read_xz(data.corpus_dir() / "tinyshakespeare" / "input.txt.xz")[:100000]
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        [text, "2024 12345 (hello) café"], vocab_size=700, special_tokens=["<|endoftext|>"], show_progress=False
    )
    model = json.loads(bpe.to_str())["model"]
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in model["merges"]]
    # keras-hub's eager path splits with Llama 3's pattern (" 'single'" -> " ", "'s", ...), its
    # TensorFlow path, like GPT-2 and the written tokenizer, with GPT-2's (" '", "s", ...).
    tokenizer = keras_hub.models.GPT2Tokenizer(vocabulary=model["vocab"], merges=merges, _allow_python_workflow=False)
    return tokenizer, text


def test_gpt2_byte_level_bpe_agrees_with_keras(gpt2_tokenizer):
    tokenizer, text = gpt2_tokenizer
    lines = text.splitlines()
    exported, _ = check_agreement(tokenizer, SENTENCES + ["a<|endoftext|>b", "x\u00a0y\u3000z"] + lines[:400:40])
    end = tokenizer.token_to_id("<|endoftext|>")
    assert exported.start_token_id == end and exported.stop_token_ids == [end]


def test_gpt2_characters_outside_the_merges_are_their_bytes(gpt2_tokenizer):
    tokenizer, _ = gpt2_tokenizer
    loaded = tokenizers.Tokenizer.from_str(hugging_face_tokenizer(tokenizer).tokenizer.to_str())
    byte_symbols = {byte: symbol for byte, symbol in zip(range(256), _gpt2_byte_symbols())}
    # An emoji is its four UTF-8 bytes, one token each (none merged in a Shakespeare vocabulary).
    expected = [tokenizer.token_to_id(byte_symbols[byte]) for byte in "😀".encode()]
    assert loaded.encode("😀").ids == np.asarray(tokenizer("😀")).tolist() == expected
    assert loaded.decode(expected) == "😀"


def _gpt2_byte_symbols():
    """GPT-2's printable stand-ins for the bytes 0..255 (the paper's code, written out)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(byte) if byte in printable else chr(next(extra)) for byte in range(256)]


def test_a_byte_level_vocabulary_without_every_byte_is_refused():
    vocabulary = {"a": 0, "b": 1, "ab": 2, "<|endoftext|>": 3}
    with pytest.raises(ValueError, match="must hold a token for each of the 256 bytes"):
        hugging_face_tokenizer(keras_hub.models.GPT2Tokenizer(vocabulary=vocabulary, merges=["a b"]))


def test_special_token_ids_come_from_the_tokenizer():
    """Start and stop tokens are the tokenizer's own, wherever its vocabulary puts them."""
    # A WordPiece vocabulary whose [EOS] is id 9, not kzoo's 6.
    vocabulary = ["[UNK]", "[PAD]", "hola", "mundo", "[CLS]", "[SEP]", "[MASK]", "!", "[BOS]", "[EOS]"]
    exported = hugging_face_tokenizer(keras_hub.tokenizers.WordPieceTokenizer(vocabulary))
    assert exported.start_token_id is None and exported.stop_token_ids == [9]
    # BERT's end token is [SEP] (here id 5).
    assert hugging_face_tokenizer(BertTokenizer(vocabulary)).stop_token_ids == [5]
    # GPT-2's <|endoftext|> at id 256, not at the end.
    symbols = _gpt2_byte_symbols()
    vocabulary = {symbol: i for i, symbol in enumerate(symbols)}
    vocabulary.update({"<|endoftext|>": 256, "ab": 257})
    exported = hugging_face_tokenizer(keras_hub.models.GPT2Tokenizer(vocabulary=vocabulary, merges=["a b"]))
    assert exported.start_token_id == 256 and exported.stop_token_ids == [256]
    # A character tokenizer stops at its end token.
    assert hugging_face_tokenizer(data.CharacterTokenizer(256)).stop_token_ids == [data.CharacterTokenizer.end_token_id]
    without_end = keras_hub.tokenizers.WordPieceTokenizer(["[UNK]", "hola"])
    with pytest.raises(ValueError, match="needs an end token"):
        hugging_face_tokenizer(without_end)


def test_unsupported_tokenizers_are_refused():
    with pytest.raises(ValueError, match="No tokenizer.json writer for a SentencePieceTokenizer"):
        hugging_face_tokenizer(keras_hub.tokenizers.SentencePieceTokenizer())
    lowercase = keras_hub.tokenizers.UnicodeCodepointTokenizer(vocabulary_size=128, lowercase=True)
    with pytest.raises(ValueError, match="lowercase"):
        hugging_face_tokenizer(lowercase)
    unsplit = keras_hub.tokenizers.WordPieceTokenizer(["[UNK]", "[EOS]", "hola"], split=False)
    with pytest.raises(ValueError, match="split"):
        hugging_face_tokenizer(unsplit)


CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.mark.parametrize("kind", ["qwen2", "llama3", "llama"])
def test_hf_tokenizers_are_their_own_tokenizer_json(kind, tmp_path):
    """An HFTokenizer (Qwen2's and Llama 3's byte-level BPE, Llama 2's SentencePiece): the written
    tokenizer.json gives its ids (the start token is the runtime's to add), in Python and in a
    graph, and its text; the start token is its BOS, the stops its EOS and end-of-turn token."""
    if kind == "llama":
        folder = tokenizer_files.write_sentencepiece_folder(tmp_path, kind, CHATML)
    else:
        folder = tokenizer_files.write_byte_level_folder(tmp_path, kind, CHATML)
    tokenizer, _ = read_llama_tokenizer(folder)
    added = list(tokenizer.added_tokens().values())
    exported, loaded = check_agreement(tokenizer, tokenizer_files.TEXTS + [f"{added[0]}Hola{added[-1]} mundo"])
    start, stops = {"qwen2": (None, ["<|im_end|>"]), "llama3": (0, ["<|eot_id|>"]), "llama": (1, ["</s>"])}[kind]
    assert exported.start_token_id == tokenizer.start_token_id == start
    assert exported.stop_token_ids == [tokenizer.token_to_id(token) for token in stops]
    assert exported.chat_template == CHATML
    # The runtime renders the chat and tokenizes it as kzoo does.
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "¿Qué tal? 😀"}], add_generation_prompt=True)
    assert loaded.encode(chat).ids == np.asarray(tokenizer(chat)).tolist()


def test_an_hf_tokenizer_without_a_stop_token_is_refused():
    with pytest.raises(ValueError, match="needs an EOS token"):
        hugging_face_tokenizer(HFTokenizer(tokenizer_files.byte_level_tokenizer("gpt2", 300)))


def _read_xz(path):
    with lzma.open(path, "rt", encoding="utf-8") as file:
        return file.read()
