"""Behaviour every task model shares: saving, training, gradients, precision."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.models.fresh_process import assert_reload_in_fresh_process
from tests.models.tiny_models import TASKS
from tests.models.tiny_models import bert_backbone
from tests.models.tiny_models import gpt_backbone
from tests.models.tiny_models import task_batch


def _loss(model, x, y, sample_weight):
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight")
    return float(loss(y, model(x), sample_weight=sample_weight))


def test_keras_round_trip_in_a_fresh_process(tmp_path):
    saved = {}
    for name in TASKS:
        model, x, _, _ = task_batch(name)
        # Compiled, so that the optimizer, schedule, loss and metrics are saved too.
        model.compile(warmup_steps=10, decay_steps=100)
        saved[name] = (model, x)
    saved["GPTBackbone"] = (gpt_backbone(), task_batch("GPTCausalLM")[1])
    saved["BertBackbone"] = (bert_backbone(), task_batch("BertClassifier")[1])
    assert_reload_in_fresh_process(tmp_path, saved)


# One layer: tracing the train step is most of the test's time (60 graph steps cost less than
# one trace), and each layer adds its ops, and AdamW's per variable, to the trace.
@pytest.mark.parametrize("name", TASKS)
def test_overfits_a_tiny_batch(name):
    model, x, y, sample_weight = task_batch(name, num_layers=1)
    model.compile(learning_rate=1e-2, warmup_steps=5)
    before = _loss(model, x, y, sample_weight)
    batch = (x, y) if sample_weight is None else (x, y, sample_weight)
    traces = []
    train_step = model.train_step
    model.train_step = lambda data: traces.append(data) or train_step(data)
    # One epoch of 60 steps: a dataset, so that fit sets up only once.
    model.fit(tf.data.Dataset.from_tensors(batch).repeat(60), verbose=0)
    after = _loss(model, x, y, sample_weight)
    assert after <= 0.1 * before, (before, after)
    # Traced once: not a second time because the optimizer made its variables in the first.
    assert len(traces) == 1


# The [CLS] pooler only serves sentence-level heads.
_UNUSED = {"BertMaskedLM": ("pooler",), "BertTokenClassifier": ("pooler",)}


@pytest.mark.parametrize("name", TASKS)
def test_gradients_reach_every_trainable_variable(name):
    model, x, y, sample_weight = task_batch(name)
    with tf.GradientTape() as tape:
        loss = keras.losses.sparse_categorical_crossentropy(y, model(x, training=True), from_logits=True)
        loss = keras.ops.mean(loss if sample_weight is None else loss * sample_weight)
    variables = model.trainable_variables
    gradients = tape.gradient(loss, variables)

    table = model.backbone.embedding.embeddings
    assert sum(variable is table for variable in variables) == 1  # tied, not copied
    for variable, gradient in zip(variables, gradients):
        if any(part in variable.path for part in _UNUSED.get(name, ())):
            assert gradient is None, variable.path
            continue
        assert gradient is not None, variable.path
        assert np.any(np.asarray(gradient) != 0), variable.path


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("name", TASKS)
def test_mixed_precision_forward_and_fit_step(name, policy):
    keras.config.set_dtype_policy(policy)
    model, x, y, sample_weight = task_batch(name)
    logits = model(x)
    assert logits.dtype == "float32"
    assert np.all(np.isfinite(np.asarray(logits)))
    # One eager step: tracing a train function per model and policy would
    # dominate the test time; float32 training in graph mode is tested above.
    model.compile(run_eagerly=True)
    if policy == "mixed_float16":
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    loss = model.train_on_batch(x, y, sample_weight=sample_weight, return_dict=True)["loss"]
    assert np.isfinite(loss)
    assert np.all(np.isfinite(np.asarray(model(x))))


def test_compile_defaults():
    model, x, y, sample_weight = task_batch("GPTCausalLM")
    model.compile(learning_rate=1e-3, warmup_steps=10, decay_steps=100)
    assert isinstance(model.optimizer, keras.optimizers.AdamW)
    schedule = keras.optimizers.schedules.deserialize(model.optimizer.get_config()["learning_rate"])
    np.testing.assert_allclose(
        [float(schedule(step)) for step in (0, 5, 10, 60, 110, 500)],
        [0.0, 5e-4, 1e-3, 5e-4, 0.0, 0.0],
        atol=1e-7,
    )
    metrics = model.evaluate(x, y, sample_weight=sample_weight, verbose=0, return_dict=True)
    assert set(metrics) == {"loss", "accuracy", "perplexity"}
    # Perplexity is exp of the loss: both average over the real tokens only.
    np.testing.assert_allclose(metrics["perplexity"], np.exp(metrics["loss"]), rtol=1e-5)


def test_a_reloaded_model_continues_training_from_its_saved_optimizer_state(tmp_path):
    model, x, y, sample_weight = task_batch("GPTCausalLM")
    # Eager steps (the saved compile state keeps `run_eagerly` for the reloaded model): the four
    # steps cost less than tracing a train step for the model and again for the reloaded one.
    model.compile(learning_rate=1e-2, warmup_steps=5, decay_steps=50, run_eagerly=True)
    model.fit(x, y, sample_weight=sample_weight, epochs=3, verbose=0)
    model.save(tmp_path / "model.keras")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reloaded = keras.saving.load_model(tmp_path / "model.keras")
    assert not [w for w in caught if "compile()" in str(w.message)]  # Keras restored the compile state
    assert int(reloaded.optimizer.iterations) == 3  # the warmup/decay schedule goes on from step 3
    for original, restored in zip(model.optimizer.variables, reloaded.optimizer.variables):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(original), keras.ops.convert_to_numpy(restored))

    # One more step from each gives the same weights: Adam's moments came back too.
    for m in (model, reloaded):
        m.fit(x, y, sample_weight=sample_weight, epochs=1, verbose=0)
    for a, b in zip(model.weights, reloaded.weights):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b), atol=1e-6)


def test_only_kzoo_s_own_decay_exclusions_are_saved_with_the_compile_state():
    model, _, _, _ = task_batch("GPTCausalLM")
    model.compile()
    assert model.get_compile_config()["no_weight_decay"] == ["bias", "gamma", "beta"]
    # A user's own AdamW decays what it decays: a reload must not add kzoo's exclusions.
    model.compile(optimizer=keras.optimizers.AdamW(1e-3))
    assert "no_weight_decay" not in model.get_compile_config()
