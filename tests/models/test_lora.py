"""`backbone.enable_lora(rank)`: Keras' layer LoRA on the attention projections, on every task model with a backbone.

LoRA fine-tuning must train the low-rank weights and nothing else of the
backbone, reach every one of them, and change what the model infers; a saved
model keeps the adapted weights.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import kzoo
from kzoo import models
from tests.models.tiny_models import task_batch


def _is_lora(path):
    return "lora" in path


def _snapshot(weights):
    return {w.path: keras.ops.convert_to_numpy(w) for w in weights}


@pytest.mark.parametrize(
    "name", ["GPTCausalLM", "BertMaskedLM", "BertClassifier", "BertTokenClassifier", "Seq2SeqTransformer"]
)
def test_lora_trains_only_its_weights_reaches_each_and_changes_the_logits(name, tmp_path):
    model, x, y, sample_weight = task_batch(name)
    model(x)
    adapted = model.backbone.enable_lora(2)
    # The query and value projections of every attention (seq2seq: encoder, decoder and cross-attention).
    attentions = [
        layer for layer in model.backbone._flatten_layers() if isinstance(layer, kzoo.layers.MultiHeadAttention)
    ]
    assert sorted({layer.name for layer in adapted}) == ["query", "value"]
    assert len(adapted) == 2 * len(attentions) and attentions
    lora = [w for w in model.trainable_weights if _is_lora(w.path)]
    assert len(lora) == 2 * len(adapted)  # A and B per layer
    # Only LoRA weights train in the backbone (a classifier's head trains too).
    assert all(_is_lora(w.path) for w in model.backbone.trainable_weights)
    before = _snapshot(model.weights)
    logits_before = keras.ops.convert_to_numpy(model(x))

    # Eager steps, as in test_causal_lm.py's LoRA test: five of them cost less than tracing a train
    # step. The GPT keeps the traced step `fit` runs by default, so that one LoRA model trains in a graph.
    model.compile(learning_rate=1e-2, run_eagerly=name != "GPTCausalLM")
    model.fit(x, y, sample_weight=sample_weight, epochs=1, steps_per_epoch=5, batch_size=len(y), verbose=0)

    after = _snapshot(model.weights)
    backbone = {w.path for w in model.backbone.weights}
    frozen = [p for p in backbone if p in before and not _is_lora(p)]
    frozen_changed = [p for p in frozen if not np.array_equal(before[p], after[p])]
    assert not frozen_changed
    unchanged_lora = [w.path for w in lora if np.array_equal(before[w.path], after[w.path])]
    assert not unchanged_lora
    # Every LoRA weight receives a gradient (B is no longer zero after training, so A's is not either).
    with tf.GradientTape() as tape:
        loss = model.compute_loss(x, y, model(x, training=True), sample_weight)
    gradients = tape.gradient(loss, lora)
    assert all(g is not None and np.abs(keras.ops.convert_to_numpy(g)).max() > 0 for g in gradients)
    logits = keras.ops.convert_to_numpy(model(x))
    assert np.abs(logits - logits_before).max() > 1e-3
    # Saved with its adapted kernels.
    model.save(tmp_path / "lora.keras")
    np.testing.assert_allclose(keras.saving.load_model(tmp_path / "lora.keras")(x), logits, rtol=1e-5, atol=1e-5)


def test_enable_lora_names_what_it_could_not_find():
    backbone = models.GPTBackbone(
        vocabulary_size=10, num_layers=1, num_heads=1, hidden_dim=4, intermediate_dim=8, max_sequence_length=4
    )
    with pytest.raises(ValueError, match="target_layer_names"):
        backbone.enable_lora(2, target_layer_names=["nothing"])
    with pytest.raises(ValueError, match="`rank` must be a positive integer"):
        backbone.enable_lora(0)
    # A rank beyond the kernels' smallest dimension is refused before any weight is made.
    assert backbone.max_lora_rank() == 4
    with pytest.raises(ValueError, match=r"`rank` must be in \[1, 4\] \(the smallest dimension .* rank=100000000\."):
        backbone.enable_lora(10**8)


def _assert_decoding_equals_the_full_pass(lm, ids):
    full = keras.ops.convert_to_numpy(lm({"token_ids": ids, "padding_mask": np.ones_like(ids)}))
    logits, state = lm.prefill(ids[:, :3], ids.shape[1])
    steps = [keras.ops.convert_to_numpy(logits)]
    for index in range(3, ids.shape[1]):  # one token at a time: the side-by-side projections
        logits, state = lm.decode(ids[:, index : index + 1], state, index)
        steps.append(keras.ops.convert_to_numpy(logits))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-4, atol=1e-4)


def test_one_token_decoding_steps_equal_the_full_pass_with_lora_and_with_int8():
    ids = np.array([[5, 9, 2, 7, 7, 1, 3]], "int32")
    adapted, _, _, _ = task_batch("GPTCausalLM")
    adapted(task_batch("GPTCausalLM")[1])
    adapted.backbone.enable_lora(2)
    rng = np.random.default_rng(0)
    for weight in adapted.weights:
        if _is_lora(weight.path):  # B starts at zero: give both factors values
            weight.assign(rng.normal(size=weight.shape).astype("float32"))
    _assert_decoding_equals_the_full_pass(adapted, ids)
    quantized, x, _, _ = task_batch("GPTCausalLM")
    quantized(x)
    quantized.quantize("int8")
    _assert_decoding_equals_the_full_pass(quantized, ids)
