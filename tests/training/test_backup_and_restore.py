"""`BackupAndRestore` in one process: a run stopped after a backup and started again in a fresh
model ends with the weights of an uninterrupted run (the kill tests of test_distributed_fit.py run
each attempt in its own process; this one checks what a backup holds)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import kzoo.models
from kzoo.training import BackupAndRestore

STEPS = 6


class Stop(Exception):
    pass


class StopAfter(keras.callbacks.Callback):
    """Raises `Stop` after training step `step` (1-based): the run ends there, as if killed."""

    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if batch + 1 == self.step:
            raise Stop


def lora_lm():
    keras.utils.set_random_seed(0)
    lm = kzoo.models.CausalLM.from_preset("llama_tiny")
    lm.backbone.enable_lora(2, target_layer_names=["query", "value", "gate_dense"])
    # Eager steps: the three runs' 13 steps cost less than tracing a train step for each run, and
    # what a backup holds does not depend on how the steps ran.
    lm.compile(learning_rate=1e-2, run_eagerly=True)
    return lm


def train(backup_dir, stop_after=None):
    ids = np.random.default_rng(0).integers(1, 256, (STEPS * 4, 9)).astype("int32")
    x = {"token_ids": ids[:, :-1], "padding_mask": np.ones_like(ids[:, :-1])}
    stream = tf.data.Dataset.from_tensor_slices((x, ids[:, 1:])).batch(4).repeat()
    lm = lora_lm()
    callbacks = [BackupAndRestore(str(backup_dir), save_freq=2)]
    if stop_after:
        callbacks.append(StopAfter(stop_after))
    lm.fit(stream, epochs=1, steps_per_epoch=STEPS, callbacks=callbacks, verbose=0)
    return lm


def test_a_lora_run_resumes_with_its_lora_weights_and_unmerged_kernels(tmp_path):
    """Keras saves a LoRA layer's kernel merged (W + A B) and loads it with A = B = 0, which would
    resume a LoRA run with B = 0 and A = 0: no gradient would reach them again. The backup keeps
    W, A and B as they are."""
    reference = train(tmp_path / "reference")
    with pytest.raises(Stop):
        train(tmp_path / "backup", stop_after=5)  # backed up after step 4
    resumed = train(tmp_path / "backup")
    for actual, expected in zip(resumed.weights, reference.weights, strict=True):
        assert actual.path == expected.path
        np.testing.assert_allclose(actual.numpy(), expected.numpy(), rtol=0, atol=1e-6, err_msg=actual.path)
    lora = [weight for weight in resumed.trainable_weights if "lora_kernel_b" in weight.path]
    assert lora and all(np.abs(weight.numpy()).max() > 0 for weight in lora)
