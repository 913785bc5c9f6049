"""Trains a tiny kzoo language model for the tests of `kzoo.training`, in its own process.

    python train_tiny_lm.py {single,mirrored,multi_worker} OUTPUT_DIR WEIGHTS_FILE [DROPOUT]

- single: the default strategy, one CPU.
- mirrored: `MirroredStrategy` over two logical CPUs, set before TensorFlow starts.
- multi_worker: `MultiWorkerMirroredStrategy` from TF_CONFIG.

Every mode trains the same model (dropout DROPOUT, default 0) on the same
global batches for `EPOCHS * STEPS_PER_EPOCH` steps, validating after each
epoch, with `kzoo.training.callbacks(OUTPUT_DIR, ..., keep_backup=True)`, then
saves the weights to WEIGHTS_FILE (.npz) and, as a recipe does once its files
are written, deletes the backup.

To stop the run at a given point for a kill, a test writes it to
OUTPUT_DIR/pause_at: "train S" after training step S (1-based, over the whole
run), "validation E B" after validation batch B of epoch E (both 1-based), or
"save" after `fit`, before the weights file is written. The run then writes
OUTPUT_DIR/paused there and sleeps; the test removes pause_at before it
restarts the same command.
"""

import contextlib
import importlib.util
import os
import shutil
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

VOCABULARY_SIZE = 32
SEQUENCE_LENGTH = 8
GLOBAL_BATCH_SIZE = 8
EPOCHS = 2
STEPS_PER_EPOCH = 6
BACKUP_FREQ = 2


def main(mode, output_dir, weights_file, dropout="0"):
    # The machine running the tests is small and shared.
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    if mode == "mirrored":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    tf.config.experimental.enable_op_determinism()

    import keras

    import kzoo.models
    import kzoo.training

    strategy = {
        "single": lambda: tf.distribute.get_strategy(),
        "mirrored": lambda: tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]),
        "multi_worker": lambda: kzoo.training.get_strategy("multi_worker"),
    }[mode]()
    config = kzoo.training.configure(strategy)
    config.per_replica_batch_size(GLOBAL_BATCH_SIZE)

    keras.utils.set_random_seed(0)
    with config.strategy.scope():
        # A kzoo task model: `Task` carries the multi-worker fix.
        model = kzoo.models.GPTCausalLM(
            kzoo.models.GPTBackbone(
                vocabulary_size=VOCABULARY_SIZE,
                num_layers=1,
                num_heads=2,
                hidden_dim=16,
                intermediate_dim=32,
                max_sequence_length=SEQUENCE_LENGTH,
                dropout=float(dropout),
            )
        )
        # A schedule on optimizer.iterations, the global step, which the backup
        # restores with the momentum. Not Adam: the attention's key bias has
        # no gradient (softmax is shift-invariant), and Adam would scale the
        # round-off that stands for it, which differs between devices, up to
        # the learning rate.
        learning_rate = keras.optimizers.schedules.CosineDecay(0.0, decay_steps=8, warmup_target=0.1, warmup_steps=4)
        model.compile(
            optimizer=keras.optimizers.SGD(learning_rate, momentum=0.9),
            jit_compile=config.jit_compile,
        )

    def examples(tokens):
        return tf.data.Dataset.from_tensor_slices(
            ({"token_ids": tokens[:, :-1], "padding_mask": np.ones_like(tokens[:, :-1])}, tokens[:, 1:])
        )

    tokens = np.random.default_rng(0).integers(1, VOCABULARY_SIZE, (88, SEQUENCE_LENGTH + 1)).astype("int32")
    stream = kzoo.training.shard_by_data(
        examples(tokens[:64]).repeat().shuffle(64, seed=1, reshuffle_each_iteration=False).batch(GLOBAL_BATCH_SIZE)
    )
    validation = kzoo.training.shard_by_data(examples(tokens[64:]).batch(GLOBAL_BATCH_SIZE))

    def pause_if(point):
        with contextlib.suppress(FileNotFoundError):  # Workers share the file.
            if open(os.path.join(output_dir, "pause_at")).read() == point:
                open(os.path.join(output_dir, "paused"), "w").close()
                time.sleep(600)

    class PauseAt(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            pause_if(f"train {self.epoch * STEPS_PER_EPOCH + batch + 1}")

        def on_test_batch_end(self, batch, logs=None):
            pause_if(f"validation {self.epoch + 1} {batch + 1}")

    callbacks = kzoo.training.callbacks(
        output_dir,
        config.strategy,
        backup_freq=BACKUP_FREQ,
        tensorboard=importlib.util.find_spec("tensorboard") is not None,
        keep_backup=True,
    )
    model.fit(
        stream,
        epochs=EPOCHS,
        steps_per_epoch=STEPS_PER_EPOCH,
        validation_data=validation,
        callbacks=callbacks + [PauseAt()],
        verbose=0,
    )
    pause_if("save")
    np.savez(weights_file, *model.get_weights())
    if kzoo.training.is_chief(config.strategy):
        shutil.rmtree(os.path.join(output_dir, "backup"))


if __name__ == "__main__":
    main(*sys.argv[1:])
