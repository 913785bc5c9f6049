"""The SavedModel signature that takes raw strings, for models saved with a tokenizer.

Each model is saved with a keras-hub tokenizer beside it (as the recipes do), exported, and
its text signature, loaded with plain TensorFlow, is compared with the Keras model on the
same strings tokenized and decoded in Python.
"""

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf

from kzoo import data
from kzoo import export
from kzoo.tokenizers.word_piece import BOS_ID
from kzoo.tokenizers.word_piece import CLS_ID
from kzoo.tokenizers.word_piece import EOS_ID
from kzoo.tokenizers.word_piece import SEP_ID
from tests.export.tiny_models import MAX_LENGTH
from tests.export.tiny_models import build

SENTENCES = ["the cat sat on the mat", "a dog ran to the park", "the bird sang a song", "it was a fine day"]


def word_pieces():
    return data.word_piece_tokenizer(data.train_word_piece_vocabulary(SENTENCES, 64))


def word_pieces_with_bos_and_eos_last():
    """A WordPiece tokenizer whose [BOS] and [EOS] are not at kzoo's ids: the text signature
    must read them from the tokenizer."""
    vocabulary = data.train_word_piece_vocabulary(SENTENCES, 64)
    moved = ["[BOS]", "[EOS]"]
    vocabulary = [token for token in vocabulary if token not in moved] + moved
    return keras_hub.tokenizers.WordPieceTokenizer(vocabulary=vocabulary, special_tokens=moved)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """`exported(family) -> (export dir, model, tokenizer)`, exported once per family."""
    exports = {}

    def get(family):
        folder = tmp_path_factory.mktemp(family) if family not in exports else exports[family]
        if family not in exports:
            if family in ("gpt", "bilstm_classifier"):
                tokenizer = data.character_tokenizer(128)
            elif family == "seq2seq":
                tokenizer = word_pieces_with_bos_and_eos_last()
            else:
                tokenizer = word_pieces()
            model = build(family, vocabulary_size=tokenizer.vocabulary_size())
            model.save(folder / "model.keras")
            data.save_tokenizer(tokenizer, folder)
            export.export(
                folder / "model.keras",
                folder / "export",
                formats=["savedmodel"],
                num_examples=2,
                generate_tokens=6,
                latency_runs=1,
            )
            exports[family] = folder
        return folder / "export", keras.saving.load_model(folder / "model.keras"), data.load_tokenizer(folder)

    return get


def text_signature(out, name):
    loaded = tf.saved_model.load(str(out / "savedmodel"))
    assert name in loaded.signatures
    return loaded.signatures[name]


def test_gpt_generate_text_continues_each_prompt_as_keras_does(exported):
    out, model, tokenizer = exported("gpt")
    generate_text = text_signature(out, "generate_text")
    prompts = ["ROMEO:", "To be, or"]  # ragged: 6 and 9 characters
    result = generate_text(
        text=tf.constant(prompts), max_new_tokens=tf.constant(5), stop_token_ids=tf.constant([], tf.int32)
    )

    ids = [np.asarray(tokenizer(prompt)).tolist() for prompt in prompts]
    expected = model.generate(ids, max_length=9 + 5, jit_compile=False)  # the longest prompt + 5
    assert [t.decode() for t in result["text"].numpy()] == [tokenizer.detokenize(tokens) for tokens in expected]
    assert [len(t) for t in result["text"].numpy()] == [6 + 8, 9 + 5]  # each row fills the shared length


def test_gpt_generate_text_rejects_an_empty_prompt_and_no_new_tokens(exported):
    out, _, _ = exported("gpt")
    generate_text = text_signature(out, "generate_text")
    no_stop = tf.constant([], tf.int32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="at least one token"):
        generate_text(text=tf.constant(["ROMEO:", ""]), max_new_tokens=tf.constant(3), stop_token_ids=no_stop)
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_new_tokens"):
        generate_text(text=tf.constant(["ROMEO:"]), max_new_tokens=tf.constant(0), stop_token_ids=no_stop)
    with pytest.raises(tf.errors.InvalidArgumentError, match="maximum length 16"):
        generate_text(text=tf.constant(["x" * 16]), max_new_tokens=tf.constant(1), stop_token_ids=no_stop)


def test_bert_classify_text_packs_cls_and_sep_as_the_pipeline_does(exported):
    out, model, tokenizer = exported("bert_classifier")
    result = text_signature(out, "classify_text")(text=tf.constant(SENTENCES[:2]))

    # Packed by hand: [CLS] pieces [SEP], the pieces cut to fit the 16 positions, padded to the longer row.
    pieces = [np.asarray(tokenizer(text)).tolist() for text in SENTENCES[:2]]
    assert max(map(len, pieces)) > MAX_LENGTH - 2  # the cut is exercised
    rows = [[CLS_ID, *row[: MAX_LENGTH - 2], SEP_ID] for row in pieces]
    ids = np.zeros((2, max(map(len, rows))), np.int32)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    logits = model({"token_ids": ids, "segment_ids": 0 * ids, "padding_mask": (ids != 0).astype(np.int32)})
    probabilities = keras.ops.convert_to_numpy(keras.ops.softmax(logits, axis=-1))
    np.testing.assert_allclose(result["probabilities"].numpy(), probabilities, atol=1e-5)
    np.testing.assert_array_equal(result["label"].numpy(), probabilities.argmax(-1))


def test_a_classifier_whose_tokenizer_has_no_cls_classifies_the_tokens_alone(exported):
    out, model, tokenizer = exported("bilstm_classifier")  # characters: no [CLS] or [SEP] to wrap them in
    result = text_signature(out, "classify_text")(text=tf.constant(SENTENCES[:2]))

    rows = [np.asarray(tokenizer(text)).tolist() for text in SENTENCES[:2]]
    ids = np.zeros((2, max(map(len, rows))), np.int32)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    probabilities = keras.ops.convert_to_numpy(keras.ops.softmax(model(ids), axis=-1))
    np.testing.assert_allclose(result["probabilities"].numpy(), probabilities, atol=1e-5)


def test_seq2seq_generate_text_decodes_from_bos_to_eos(exported):
    out, model, tokenizer = exported("seq2seq")
    result = text_signature(out, "generate_text")(text=tf.constant(SENTENCES[2:]), max_new_tokens=tf.constant(6))

    sources = [np.asarray(tokenizer(text)).tolist() for text in SENTENCES[2:]]
    bos_id, eos_id = tokenizer.token_to_id("[BOS]"), tokenizer.token_to_id("[EOS]")
    assert (bos_id, eos_id) != (BOS_ID, EOS_ID)
    expected = model.generate(sources, bos_id, max_length=7, stop_token_ids=[eos_id], jit_compile=False)
    expected = [tokenizer.detokenize([t for t in tokens if t not in (bos_id, eos_id)]) for tokens in expected]
    assert [t.decode() for t in result["text"].numpy()] == expected


def test_the_report_records_the_verified_text_signature(exported):
    import json

    out, _, _ = exported("bert_classifier")
    report = json.loads((out / export.REPORT_FILE).read_text())
    text = report["artifacts"]["savedmodel"]["text"]
    assert text["matches_keras"] and text["max_abs_diff"] <= export.FP32_TOLERANCE
    assert report["artifacts"]["savedmodel"]["signatures"] == ["classify_text", "serving_default"]


def test_no_tokenizer_no_text_signature(tmp_path):
    build("bert_classifier").save(tmp_path / "model.keras")
    report = export.export(
        tmp_path / "model.keras", tmp_path / "export", formats=["savedmodel"], num_examples=2, latency_runs=1
    )
    assert report["artifacts"]["savedmodel"]["signatures"] == ["serving_default"]
