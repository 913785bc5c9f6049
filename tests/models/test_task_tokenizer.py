"""Tokenizers: Hugging Face's ids from keras-hub tokenizers, and tasks that carry theirs.

The reference ids come from Hugging Face's `tokenizers` package reading the same files.
"""

import json
import os
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
import tokenizers

import kzoo
import kzoo.data
from kzoo.checkpoints.hf import tokenizer_files
from kzoo.tokenizers import packing
from kzoo.tokenizers.bert import BertTokenizer
from tests.models import hf_folders

# Real sentences: accents, punctuation, emoji (with joiners and variation selectors), CJK,
# Hangul, Cyrillic and Greek, Unicode spaces and control characters, special tokens.
SENTENCES = [
    "Crème brûlée at the Café — naïve façade, 10% off!!",
    "Ünïcödé ÀÉÎÕÜ Straße İstanbul ΣΊΣΥΦΟΣ σοφός",
    "I ❤️ emoji 😂🎉 👨‍👩‍👧 ok",
    "東京は日本の首都です。你好，世界！",
    "한국어 문장입니다.",
    "Wait… that's ™ ½ ² ﬁne “quoted” ‘single’ «guillemets»",
    "tabs\tand\nnewlines  and\u00a0nbsp\u200bzero-width\x85x",
    "<html> a+b=c | ~tilde ^caret `back` $5 #tag @user",
    "Русский текст, ещё!",
    "Ａｂｃ full-width ＡＢＣ１２３",
    "ОДИССЕЯ Ὀδυσσεύς",
    "the [MASK] sat on the mat [SEP] it purred",
    "ж" * 60 + " " + "x" * 120,
    "The movie's ending was... well, 'meh' (3/10).",
    "",
]


def reference_ids(tokenizer_file, text):
    reference = tokenizers.Tokenizer.from_file(str(tokenizer_file))
    reference.no_padding()
    reference.no_truncation()
    return reference.encode(text, add_special_tokens=False).ids


@pytest.fixture(scope="module")
def minilm_tokenizer():
    return tokenizer_files.load_tokenizer(hf_folders.minilm_dir())


def test_minilm_tokenizer_gives_the_ids_of_hf_tokenizers(minilm_tokenizer):
    assert isinstance(minilm_tokenizer, BertTokenizer)
    assert minilm_tokenizer.vocabulary_size() == 30522 and minilm_tokenizer.lowercase
    for text in SENTENCES:
        expected = reference_ids(hf_folders.minilm_dir() / "tokenizer.json", text)
        assert np.asarray(minilm_tokenizer(text)).tolist() == expected, text


def test_the_same_ids_in_a_batch_and_inside_tf_data(minilm_tokenizer):
    one_by_one = [np.asarray(minilm_tokenizer(text)).tolist() for text in SENTENCES]
    assert minilm_tokenizer(SENTENCES) == one_by_one
    dataset = tf.data.Dataset.from_tensor_slices(SENTENCES).map(minilm_tokenizer)
    assert [ids.numpy().tolist() for ids in dataset] == one_by_one


def test_vocab_txt_alone_gives_the_same_tokenizer(tmp_path, minilm_tokenizer):
    for name in ("vocab.txt", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((hf_folders.minilm_dir() / name).read_bytes())
    from_vocabulary = tokenizer_files.load_tokenizer(tmp_path, {"model_type": "bert"})
    for text in SENTENCES:
        assert np.asarray(from_vocabulary(text)).tolist() == np.asarray(minilm_tokenizer(text)).tolist()


def test_cased_word_pieces_keep_case_and_accents(tmp_path):
    hf_folders.write_vocabulary(tmp_path)
    reference = tokenizers.BertWordPieceTokenizer(str(tmp_path / "vocab.txt"), lowercase=False)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    ours = tokenizer_files.load_tokenizer(tmp_path, {"model_type": "bert"})
    assert not ours.lowercase and not ours.strip_accents
    for text in ["The Fine film", "crème brûlée é", "HELLO world!", *SENTENCES[:5]]:
        assert np.asarray(ours(text)).tolist() == reference.encode(text, add_special_tokens=False).ids, text


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    hf_folders.write_gpt2(folder, "GPT2LMHeadModel")
    return folder


def test_byte_level_bpe_gives_the_ids_of_hf_tokenizers(gpt2_folder):
    ours = tokenizer_files.load_tokenizer(gpt2_folder)
    texts = [*SENTENCES, "ROMEO: But soft!", "  leading and trailing  ", "it's they're I'm", "a\n\nb <|endoftext|>"]
    for text in texts:
        assert np.asarray(ours(text)).tolist() == reference_ids(gpt2_folder / "tokenizer.json", text), text
    # And in a graph (tf.data), where keras-hub runs its TensorFlow path.
    dataset = tf.data.Dataset.from_tensor_slices(texts).map(ours)
    expected = [reference_ids(gpt2_folder / "tokenizer.json", text) for text in texts]
    assert [ids.numpy().tolist() for ids in dataset] == expected
    # vocab.json + merges.txt alone read the same.
    (gpt2_folder / "tokenizer.json").rename(gpt2_folder / "tokenizer.json.off")
    try:
        files_only = tokenizer_files.load_tokenizer(gpt2_folder)
    finally:
        (gpt2_folder / "tokenizer.json.off").rename(gpt2_folder / "tokenizer.json")
    assert all(np.asarray(files_only(t)).tolist() == np.asarray(ours(t)).tolist() for t in texts)


# === Tasks carry their tokenizer ===


def tiny_bert(vocabulary_size):
    return kzoo.models.BertBackbone(
        vocabulary_size=vocabulary_size,
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=32,
    )


def run_fresh(script, *args):
    """Runs `script` in a new interpreter that imports only keras and kzoo."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


# The three tests below reload their file in this process; the e2e test after them reads all three in
# one fresh process, where `import kzoo` alone must bring the classes and the file the vocabulary.
TEXTS = ["a fine film", "The movie was DULL!", "crème brûlée"]
BYTE_PAIR_PROMPTS = ["ROMEO: But soft", "Crème 😂"]


def text_classifier():
    tokenizer = BertTokenizer(hf_folders.VOCABULARY, lowercase=True)
    return kzoo.models.BertClassifier(tiny_bert(len(hf_folders.VOCABULARY)), 3, tokenizer=tokenizer)


def character_lm():
    backbone = kzoo.models.GPTBackbone.from_preset("gpt_tiny")
    return kzoo.models.GPTCausalLM(backbone, tokenizer=kzoo.data.character_tokenizer(256))


def byte_pair_lm(gpt2_folder):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return kzoo.models.GPTCausalLM.from_preset(str(gpt2_folder))


def test_a_classifier_predicts_labels_from_text_and_keeps_its_tokenizer(tmp_path):
    classifier = text_classifier()
    labels = classifier.predict(TEXTS, verbose=0)
    # The same as the logits of `[CLS] pieces [SEP]`, packed by hand.
    pieces = [[2, *np.asarray(classifier.tokenizer(text)).tolist(), 3] for text in TEXTS]
    longest = max(map(len, pieces))
    ids = np.array([row + [0] * (longest - len(row)) for row in pieces], "int32")
    logits = classifier.predict({"token_ids": ids, "segment_ids": 0 * ids, "padding_mask": (ids > 0) * 1}, verbose=0)
    np.testing.assert_array_equal(labels, np.argmax(logits, -1))
    assert classifier.predict("a fine film", verbose=0).tolist() == labels[:1].tolist()
    # Saved and reloaded: the file holds the vocabulary.
    classifier.save(tmp_path / "classifier.keras")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["classifier.keras"]
    reloaded = keras.saving.load_model(tmp_path / "classifier.keras")
    assert reloaded.predict(TEXTS, verbose=0).tolist() == labels.tolist()


def test_a_language_model_generates_text_and_keeps_its_tokenizer(tmp_path):
    lm = character_lm()
    text = lm.generate("ROMEO:", max_new_tokens=8, jit_compile=False)
    ids = lm.generate([[ord(c) for c in "ROMEO:"]], max_new_tokens=8, jit_compile=False)[0]
    assert text == "".join(map(chr, ids)) and text.startswith("ROMEO:") and len(text) == 14
    assert lm.generate(["ROMEO:", "JULIET"], max_new_tokens=8, jit_compile=False)[0] == text
    lm.save(tmp_path / "lm.keras")
    reloaded = keras.saving.load_model(tmp_path / "lm.keras")
    assert reloaded.generate("ROMEO:", max_new_tokens=8, jit_compile=False) == text


def test_a_byte_pair_tokenizer_travels_in_the_file(tmp_path, gpt2_folder):
    lm = byte_pair_lm(gpt2_folder)
    texts = lm.generate(BYTE_PAIR_PROMPTS, max_new_tokens=8, jit_compile=False)
    assert [t[: len(p)] for t, p in zip(texts, BYTE_PAIR_PROMPTS)] == BYTE_PAIR_PROMPTS
    lm.save(tmp_path / "lm.keras")
    reloaded = keras.saving.load_model(tmp_path / "lm.keras")
    assert reloaded.generate(BYTE_PAIR_PROMPTS, max_new_tokens=8, jit_compile=False) == texts


_PREDICT_AND_GENERATE = """
import json, sys
import keras
import kzoo
folder, texts, prompts = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
classifier = keras.saving.load_model(f"{folder}/classifier.keras")
out = {"labels": classifier.predict(texts, verbose=0).tolist()}
for name, lm_prompts in prompts.items():
    out[name] = keras.saving.load_model(f"{folder}/{name}.keras").generate(lm_prompts, max_new_tokens=8)
print(json.dumps(out))
"""


def test_tasks_read_text_with_the_tokenizers_of_their_files_in_a_fresh_process(tmp_path, gpt2_folder):
    classifier, characters, byte_pairs = text_classifier(), character_lm(), byte_pair_lm(gpt2_folder)
    prompts = {"characters": ["ROMEO:"], "byte_pairs": BYTE_PAIR_PROMPTS}
    expected = {
        "labels": classifier.predict(TEXTS, verbose=0).tolist(),
        "characters": characters.generate(prompts["characters"], max_new_tokens=8, jit_compile=False),
        "byte_pairs": byte_pairs.generate(prompts["byte_pairs"], max_new_tokens=8, jit_compile=False),
    }
    for name, model in (("classifier", classifier), ("characters", characters), ("byte_pairs", byte_pairs)):
        model.save(tmp_path / f"{name}.keras")
    assert run_fresh(_PREDICT_AND_GENERATE, tmp_path, json.dumps(TEXTS), json.dumps(prompts)) == expected


def test_ids_in_and_out_without_a_tokenizer():
    lm = kzoo.models.GPTCausalLM.from_preset("gpt_tiny")
    assert lm.tokenizer is None and len(lm.generate([[72, 105]], max_new_tokens=3, jit_compile=False)[0]) == 5
    with pytest.raises(ValueError, match="has no tokenizer"):
        lm.generate("ROMEO:", max_new_tokens=3)


def test_a_tokenizer_larger_than_the_backbone_is_refused():
    tokenizer = BertTokenizer(hf_folders.VOCABULARY)
    message = f"tokenizer has {len(hf_folders.VOCABULARY)} tokens but the backbone embeds 50"
    with pytest.raises(ValueError, match=message):
        kzoo.models.BertClassifier(tiny_bert(50), 2, tokenizer=tokenizer)


def test_packing_uses_the_tokenizers_special_ids(minilm_tokenizer):
    inputs = packing.pack(tiny_bert(30522), minilm_tokenizer, ["a fine film", "ok"])
    assert inputs["token_ids"].numpy().tolist() == [[101, 1037, 2986, 2143, 102], [101, 7929, 102, 0, 0]]
    assert inputs["padding_mask"].numpy().tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert not inputs["segment_ids"].numpy().any()


def test_is_text():
    assert packing.is_text("a") and packing.is_text(["a", "b"]) and packing.is_text(np.array(["a"]))
    assert not packing.is_text([[1, 2]]) and not packing.is_text(np.ones((1, 2), "int32"))
    assert not packing.is_text({"token_ids": np.ones((1, 2))}) and not packing.is_text([])
    # Meant as text, though not good text: `check_text` names the item that is not a string.
    assert packing.is_text(["a", 5]) and packing.is_text(np.array([None, "a"], object))
    assert keras.ops.is_tensor(tf.constant(["a"])) and packing.is_text(tf.constant(["a"]))


def test_a_classifier_written_as_a_hugging_face_folder_reads_back_with_its_tokenizer(tmp_path):
    classifier = text_classifier()
    classifier.export_to_transformers(tmp_path / "folder")
    again = kzoo.models.BertClassifier.from_preset(str(tmp_path / "folder"))
    assert again.num_classes == 3 and again.tokenizer.lowercase
    np.testing.assert_array_equal(again.predict(TEXTS, verbose=0), classifier.predict(TEXTS, verbose=0))
