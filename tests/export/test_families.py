"""Every model family's SavedModel and float32 TFLite file against its Keras model.

The families are kzoo's own models and every decoder family (`kzoo.checkpoints.families`); GPT
stands for the decoders by default, the decoder families run with KZOO_SLOW=1.

The exporter verifies itself; these tests check its files again, independently, on other
inputs: lengths 1, 7 and the maximum, a padded row, and greedy generation token for token.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from kzoo import export
from kzoo.checkpoints.families import FAMILIES as DECODER_FAMILIES
from kzoo.export.serving_signatures import input_names
from tests.export.tiny_models import MAX_LENGTH
from tests.export.tiny_models import build
from tests.export.tiny_models import inputs

LENGTHS = (1, 7, MAX_LENGTH)
FAMILIES = (
    "gpt",
    "bert_classifier",
    "bert_tagger",
    "bert_masked_lm",
    "seq2seq",
    "rnn_lm",
    "feed_forward_lm",
    "bilstm_classifier",
    *(pytest.param(model_type, marks=pytest.mark.slow) for model_type in DECODER_FAMILIES),
)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """`exported(family) -> (keras model, input names, export dir, report)`: a tiny model of
    `family` saved and exported once per module (SavedModel and float32 TFLite)."""
    exports = {}

    def get(family):
        if family not in exports:
            folder = tmp_path_factory.mktemp(family)
            build(family).save(folder / "model.keras")
            report = export.export(
                folder / "model.keras",
                folder / "export",
                formats=["savedmodel", "tflite_fp32"],
                max_length=MAX_LENGTH,
                num_examples=4,
                generate_tokens=MAX_LENGTH,
                latency_runs=1,
                compare_model_export=family == "gpt",
            )
            exports[family] = folder, report
        folder, report = exports[family]
        # Loaded in each test: the autouse fixture clears the Keras session after every test.
        model = keras.saving.load_model(folder / "model.keras")
        return model, input_names(model), folder / "export", report

    return get


def keras_logits(model, names, arrays):
    return keras.ops.convert_to_numpy(model(arrays if len(names) > 1 else arrays["token_ids"], training=False))


@pytest.mark.parametrize("family", FAMILIES)
def test_savedmodel_and_tflite_match_keras(family, exported):
    model, names, out, report = exported(family)

    for name in ("savedmodel", "tflite_fp32"):
        differences = report["artifacts"][name]["max_abs_diff"]
        assert set(differences) == {str(n) for n in LENGTHS}
        assert max(differences.values()) <= export.FP32_TOLERANCE
    serving = tf.saved_model.load(str(out / "savedmodel")).signatures["serving_default"]
    lite = export.LiteRTModel(out / "model_fp32.tflite")
    for length in LENGTHS:
        arrays = inputs(names, length)
        expected = keras_logits(model, names, arrays)
        saved = serving(**{name: tf.constant(value) for name, value in arrays.items()})["logits"].numpy()
        np.testing.assert_allclose(saved, expected, atol=1e-4, err_msg=f"SavedModel, length {length}")
        np.testing.assert_allclose(
            lite.run(**arrays)["logits"], expected, atol=1e-4, err_msg=f"TFLite, length {length}"
        )


def test_tagger_tags_are_the_argmax(exported):
    model, names, out, _ = exported("bert_tagger")
    arrays = inputs(names, 7)
    outputs = export.LiteRTModel(out / "model_fp32.tflite").run(**arrays)
    np.testing.assert_array_equal(outputs["tags"], keras_logits(model, names, arrays).argmax(-1))


def test_gpt_generation_equals_keras_generate(exported):
    model, _, out, report = exported("gpt")
    for name in ("savedmodel", "tflite_fp32"):
        assert report["artifacts"][name]["generation"]["matches_keras"]

    prompts = [[5], [9, 8, 7, 6, 5, 4, 3]]
    expected = model.generate(prompts, max_length=MAX_LENGTH, jit_compile=False)
    lite = export.LiteRTModel(out / "model_fp32.tflite")
    assert lite.signatures.keys() == {"serving_default", "prefill", "decode"}
    assert [lite.generate(prompt, MAX_LENGTH) for prompt in prompts] == expected

    # The SavedModel's compiled loop: a ragged batch, each row as Keras gives it alone.
    token_ids = np.zeros((2, MAX_LENGTH), np.int32)
    mask = np.zeros((2, MAX_LENGTH), np.int32)
    for i, prompt in enumerate(prompts):
        token_ids[i, : len(prompt)], mask[i, : len(prompt)] = prompt, 1
    generate = tf.saved_model.load(str(out / "savedmodel")).signatures["generate"]
    outputs = generate(token_ids=token_ids, padding_mask=mask, stop_token_ids=tf.constant([], tf.int32))
    assert outputs["token_ids"].numpy().tolist() == expected and outputs["padding_mask"].numpy().all()


def test_gpt_generation_stops_at_a_stop_token(exported):
    model, _, out, _ = exported("gpt")
    full = model.generate([[5]], max_length=MAX_LENGTH, jit_compile=False)[0]
    stop = full[3]
    expected = model.generate([[5]], max_length=MAX_LENGTH, stop_token_ids=[stop], jit_compile=False)[0]
    assert export.LiteRTModel(out / "model_fp32.tflite").generate([5], MAX_LENGTH, stop_token_ids=[stop]) == expected

    generate = tf.saved_model.load(str(out / "savedmodel")).signatures["generate"]
    token_ids = np.zeros((1, MAX_LENGTH), np.int32)
    token_ids[0, 0] = 5
    outputs = generate(token_ids=token_ids, padding_mask=np.int32(token_ids > 0), stop_token_ids=tf.constant([stop]))
    kept = outputs["padding_mask"].numpy()[0].astype(bool)
    assert outputs["token_ids"].numpy()[0][kept].tolist() == expected


def keras_greedy_seq2seq(model, source, prompt, max_length):
    """Greedy decoding with full forward passes of the Keras model (no cache)."""
    forward = tf.function(
        lambda source, tokens: model({"encoder_token_ids": source, "decoder_token_ids": tokens}, training=False),
        input_signature=[tf.TensorSpec([1, None], tf.int32)] * 2,
    )
    tokens = list(prompt)
    while len(tokens) < max_length:
        tokens.append(
            int(forward(np.asarray([source], np.int32), np.asarray([tokens], np.int32))[0, -1].numpy().argmax())
        )
    return tokens


def test_seq2seq_generation_equals_keras(exported):
    model, _, out, report = exported("seq2seq")
    for name in ("savedmodel", "tflite_fp32"):
        assert report["artifacts"][name]["generation"]["matches_keras"]

    sources = [[11, 12, 13, 14, 15, 16, 17, 18, 19], [30, 31]]
    bos = 5
    expected = model.generate(sources, bos, max_length=MAX_LENGTH, jit_compile=False)
    # The cache logic once more, against decoding without any cache.
    assert expected == [keras_greedy_seq2seq(model, source, [bos], MAX_LENGTH) for source in sources]
    lite = export.LiteRTModel(out / "model_fp32.tflite")
    assert [lite.generate([bos], MAX_LENGTH, encoder_token_ids=source) for source in sources] == expected

    encoder_token_ids = np.zeros((2, 9), np.int32)
    for i, source in enumerate(sources):
        encoder_token_ids[i, : len(source)] = source
    decoder_token_ids = np.zeros((2, MAX_LENGTH), np.int32)
    decoder_token_ids[:, 0] = bos
    generate = tf.saved_model.load(str(out / "savedmodel")).signatures["generate"]
    outputs = generate(
        encoder_token_ids=encoder_token_ids,
        decoder_token_ids=decoder_token_ids,
        stop_token_ids=tf.constant([], tf.int32),
    )
    assert outputs["token_ids"].numpy().tolist() == expected


def test_savedmodel_stores_each_variable_once(exported):
    model, _, out, report = exported("gpt")
    saved = report["artifacts"]["savedmodel"]
    checkpoint = tf.train.load_checkpoint(str(out / "savedmodel" / "variables" / "variables"))
    stored = [name for name in checkpoint.get_variable_to_shape_map() if "VARIABLE_VALUE" in name]
    # The position table, the token table (tied to the output layer) and the block weights, once each.
    assert len(stored) == len({id(v) for v in model.weights})
    # Keras' model.export stores each of them twice (keras-team/keras#23553).
    assert saved["keras_model_export_variables_bytes"] > 1.8 * saved["variables_bytes"]
