import json
import os
import tempfile

import keras
import tensorflow as tf


_STREAM_NEEDED = (
    "kzoo.training.BackupAndRestore resumes mid-run by skipping the batches already trained on, "
    "in one stream: `model.fit(dataset.repeat(), steps_per_epoch=...)`. For a finite dataset "
    "read once per epoch, resume at epoch ends with keras.callbacks.BackupAndRestore(save_freq='epoch')."
)


def is_chief(strategy):
    """Whether this process writes the run's files: always, but for non-chief multi-workers."""
    return strategy.extended.should_checkpoint


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """Keras' `BackupAndRestore`, made exact for a run killed mid-epoch, on one worker or many.

    Keras backs up the weights and the optimizer state (its `iterations`, so
    also the learning-rate schedule's position) every `save_freq` steps, and
    restarts the run at the epoch of the backup, but from that epoch's first
    step, and with a fresh data iterator. This callback also resumes the
    step and the data: on restart, the training steps of the interrupted
    epoch that the backup already holds are not run again, and their
    batches, with those of all the epochs before, are read and dropped, so
    that the first step after the restart trains on the batch the killed run
    would have trained on next.

    That makes the resumed run equal to an uninterrupted one when the data
    is one deterministic stream across epochs: an infinite dataset
    (`.repeat()`) whose order does not depend on how often it was iterated
    before (shuffle after `repeat()`, with a seed and
    `reshuffle_each_iteration=False`), and `model.fit(...,
    steps_per_epoch=...)`, under which Keras keeps one iterator for the whole
    run. Not restored: the state of random layers such as dropout (Keras
    does not save `SeedGenerator`s), and the metrics accumulated in the
    interrupted epoch before the backup.

    Multi-worker runs: `backup_dir` must be on storage that all workers see
    (a shared filesystem or GCS). Every worker saves at the same steps, as
    saving may read variables through collectives, but only the chief writes
    to `backup_dir`; the others write to a temporary directory, deleted at
    the end. On restart every worker restores from `backup_dir`.

    Fixed here as well: Keras forgets the epoch of a restored run, so a backup
    taken in a resumed epoch was labelled epoch 0 (and a second restart
    resumed from there).

    Args:
        backup_dir: str, where the backup is kept; deleted when `fit` ends.
        save_freq: int, back up every `save_freq` steps; or "epoch".
        strategy: the `tf.distribute.Strategy` of the model; defaults to
            the strategy in scope.
        double_checkpoint: bool, keep the previous backup too, for when the
            run is killed while writing the latest one.

    Example:
    >>> backup = kzoo.training.BackupAndRestore("/tmp/run/backup", save_freq=100)
    >>> model.fit(stream, epochs=10, steps_per_epoch=1000, callbacks=[backup])
    """

    def __init__(self, backup_dir, save_freq="epoch", strategy=None, double_checkpoint=True):
        strategy = strategy or tf.distribute.get_strategy()
        self.restore_dir = backup_dir
        self.is_chief = is_chief(strategy)
        write_dir = backup_dir if self.is_chief else tempfile.mkdtemp(prefix="kzoo_backup_")
        super().__init__(write_dir, save_freq=save_freq, double_checkpoint=double_checkpoint)
        self._epoch = 0
        self._batch = 0
        self._resume_epoch = None
        # Batches of the resumed epoch that the backup holds.
        self._resume_batches = 0
        # Batches of the stream that the backup holds, to read and drop.
        self._batches_to_drop = 0
        self._train_function = None

    def on_train_begin(self, logs=None):
        if not self.is_chief and tf.io.gfile.exists(self.restore_dir):
            for name in tf.io.gfile.listdir(self.restore_dir):
                tf.io.gfile.copy(
                    os.path.join(self.restore_dir, name), os.path.join(self.backup_dir, name), overwrite=True
                )
        super().on_train_begin(logs)
        if not tf.io.gfile.exists(self._training_metadata_path):
            return
        with tf.io.gfile.GFile(self._training_metadata_path) as file:
            metadata = json.load(file)
        # An int `save_freq` backs up after batch `metadata["batch"]` of
        # epoch `metadata["epoch"]`; "epoch" at the end of the epoch before.
        self._resume_epoch = metadata["epoch"]
        self._resume_batches = metadata["batch"] + 1 if isinstance(self.save_freq, int) else 0
        steps_per_epoch = self.params.get("steps")
        if self._resume_epoch and not steps_per_epoch:
            raise ValueError(_STREAM_NEEDED)
        self._batches_to_drop = self._resume_epoch * (steps_per_epoch or 0) + self._resume_batches
        # Keras counts `save_freq` from the last batch it saw.
        self._last_batch_seen = metadata["batch"]
        if self._batches_to_drop:
            self._train_function = self.model.train_function
            self.model.train_function = self._resume

    def on_epoch_begin(self, epoch, logs=None):
        # Keras sets `_current_epoch` only at epoch ends, from 0 on each start.
        self._epoch = self._current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self._batch = batch

    def on_train_batch_end(self, batch, logs=None):
        if not self._is_resumed_batch():
            super().on_train_batch_end(batch, logs)

    def _is_resumed_batch(self):
        """Whether the current batch was trained on before the backup."""
        return self._epoch == self._resume_epoch and self._batch < self._resume_batches

    def _resume(self, iterator):
        """The train function until the run is back where the backup was taken."""
        try:
            for _ in range(self._batches_to_drop):
                next(iterator)
        except (StopIteration, tf.errors.OutOfRangeError):
            raise ValueError(
                f"The dataset ended while skipping the {self._batches_to_drop} batches trained on "
                f"before the backup. {_STREAM_NEEDED}"
            ) from None
        self._batches_to_drop = 0
        if self._is_resumed_batch():
            return {}
        self.model.train_function = self._train_function
        return self._train_function(iterator)
