import json
import os
import tempfile

import h5py
import keras
import numpy as np
import tensorflow as tf

from kzoo import _compat
from kzoo import files

_STREAM_NEEDED = (
    "kzoo.training.BackupAndRestore resumes mid-epoch by skipping the batches already trained on, "
    "in one stream: `model.fit(dataset.repeat(), steps_per_epoch=...)`. For a finite dataset "
    "read once per epoch, back up at epoch boundaries only (save_freq='epoch')."
)
# The backup files, and the attribute of the weights file that holds the rest of the state.
LATEST = "latest.weights.h5"
PREVIOUS = "previous.weights.h5"
_STATE_ATTRIBUTE = "kzoo_training_state"
# The group of the weights file that holds the variables of the LoRA layers as they are (see `_lora_variables`).
_LORA_GROUP = "kzoo_lora_variables"


def is_chief(strategy):
    """Whether this process writes the run's files: always, but for non-chief multi-workers."""
    return strategy.extended.should_checkpoint


class BackupAndRestore(keras.callbacks.Callback):
    """Backs up a `fit` run as it trains, and resumes it exactly where the backup was.

    Like Keras' `BackupAndRestore`, it keeps the weights and the optimizer
    state (its `iterations`, so also the learning-rate schedule's position)
    and restarts an interrupted run at the epoch of its backup. It also
    resumes the step and the data, and everything else that makes the
    resumed run equal to an uninterrupted one:

    - the training steps of the interrupted epoch that the backup holds are
      not run again, and their batches, with those of all the epochs
      before, are read and dropped, so that the first step after the restart
      trains on the batch the killed run would have trained on next;
    - the state of the random layers (dropout's `SeedGenerator`s), which
      Keras does not save;
    - the running sums of the epoch's metrics, so the resumed epoch logs
      what an uninterrupted one would;
    - the variables of layers with LoRA on as they are: the frozen kernel
      and the factors A and B (Keras saves such a kernel merged, W + A B,
      and loads it with A = B = 0, from which no gradient reaches A or B).

    A backup never falls between an epoch's last batch and its end: the
    epoch's end (validation, the other callbacks' `on_epoch_end`, such as
    checkpoints and history rows) is part of it. Batch backups skip the
    epoch's last batch, and a backup is taken at every epoch boundary, once
    the epoch has ended (at the next `on_epoch_begin`, after every
    callback's `on_epoch_end`, whatever their order). A run killed during
    validation, or between epochs, repeats at most the last steps and the
    end of that epoch.

    Each backup is one file written beside the last and renamed over it
    (`kzoo.files.atomic_file`), the state in the weights file: a kill while
    writing leaves the previous backup whole, and a full disk raises
    `kzoo.files.FileError` naming the backup. Weights holding NaN or Inf
    are never backed up: the callback raises `FloatingPointError` instead,
    keeping the last finite backup (put
    `keras.callbacks.TerminateOnNaN(raise_error=True)` before it to stop on
    the loss first, as `kzoo.training.callbacks` does).

    Exact resumption needs the data to be one deterministic stream across
    epochs: an infinite dataset (`.repeat()`) whose order does not depend
    on how often it was iterated before (shuffle after `repeat()`, with a
    seed and `reshuffle_each_iteration=False`, or a seeded shuffle with a
    fixed seed), and `model.fit(..., steps_per_epoch=...)`, under which
    Keras keeps one iterator for the whole run. A finite dataset read once
    per epoch resumes at epoch boundaries (`save_freq="epoch"`).

    Restoring a backup written by another model raises `ValueError` saying
    so: delete `backup_dir` to start afresh.

    Multi-worker runs: `backup_dir` must be on storage that all workers see
    (a shared filesystem or GCS). Every worker saves at the same steps, as
    saving may read variables through collectives, but only the chief writes
    to `backup_dir`; the others write to a temporary directory, deleted at
    the end. On restart every worker restores from `backup_dir`.

    Args:
        backup_dir: str, where the backup is kept.
        save_freq: int, back up every `save_freq` steps (and at every epoch
            boundary); or "epoch", at epoch boundaries only.
        strategy: the `tf.distribute.Strategy` of the model; defaults to
            the strategy in scope.
        double_checkpoint: bool, keep the previous backup too (a second
            chance when the latest cannot be read).
        delete_checkpoint: bool, delete `backup_dir` when `fit` ends; False
            keeps a backup of the finished run (a rerun then trains no more
            and restores the final weights), for a program that still has
            files to write after `fit` and deletes the backup itself.

    Example:
    >>> model = kzoo.models.RNNLanguageModel(vocabulary_size=128, embedding_dim=8, hidden_dim=8)
    >>> model.compile()
    >>> ids = np.random.default_rng(0).integers(1, 128, (64, 9))
    >>> stream = tf.data.Dataset.from_tensor_slices((ids[:, :-1], ids[:, 1:])).repeat().batch(8)
    >>> backup = BackupAndRestore("backup_run/backup", save_freq=2)
    >>> history = model.fit(stream, epochs=2, steps_per_epoch=4, callbacks=[backup], verbose=0)
    >>> len(history.history["loss"]), os.path.exists("backup_run/backup")  # finished: no backup left
    (2, False)
    """

    def __init__(self, backup_dir, save_freq="epoch", strategy=None, double_checkpoint=True, delete_checkpoint=True):
        super().__init__()
        if save_freq != "epoch" and not (isinstance(save_freq, int) and save_freq >= 1):
            raise ValueError(f"`save_freq` must be 'epoch' or an int >= 1; received save_freq={save_freq!r}.")
        self.strategy = strategy or tf.distribute.get_strategy()
        self.restore_dir = backup_dir
        self.is_chief = is_chief(self.strategy)
        self.backup_dir = backup_dir if self.is_chief else tempfile.mkdtemp(prefix="kzoo_backup_")
        self.save_freq = save_freq
        self.double_checkpoint = double_checkpoint
        self.delete_checkpoint = delete_checkpoint
        self._epoch = 0
        self._batch = 0
        # The epoch whose start is backed up next (at the next on_epoch_begin or on_train_end).
        self._ended_epochs = None
        self._steps_since_backup = 0
        self._resume_epoch = None
        # Batches of the resumed epoch that the backup holds.
        self._resume_batches = 0
        # Batches of the stream that the backup holds, to read and drop.
        self._batches_to_drop = 0
        # The resumed epoch's metric sums, added after its first step.
        self._resume_metrics = None
        self._train_function = None

    def on_train_begin(self, logs=None):
        steps_per_epoch = self.params.get("steps")
        if isinstance(self.save_freq, int) and not steps_per_epoch:
            raise ValueError(_STREAM_NEEDED)
        if not self.model.built:
            raise ValueError("BackupAndRestore needs a built model: build it (call it on a batch) before `fit`.")
        if self.model.optimizer is not None and not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)
        state = self._restore()
        if state is None:
            return
        # {"epoch": e, "batch": b}: batches 0..b of epoch e are trained (b = -1: none).
        self._resume_epoch = state["epoch"]
        self._resume_batches = state["batch"] + 1
        self._batches_to_drop = self._resume_epoch * (steps_per_epoch or 0) + self._resume_batches
        self._resume_metrics = state.get("metrics")
        _compat.set_initial_epoch(self.model, self._resume_epoch)  # As Keras' BackupAndRestore.
        if self._batches_to_drop:
            self._train_function = self.model.train_function
            self.model.train_function = self._resume

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        if self._ended_epochs is not None:
            self._save(self._ended_epochs, -1)

    def on_train_batch_begin(self, batch, logs=None):
        self._batch = batch

    def on_train_batch_end(self, batch, logs=None):
        if self._is_resumed_batch() or self.save_freq == "epoch":
            return
        self._steps_since_backup += 1
        last_of_epoch = batch + 1 == self.params["steps"]
        if self._steps_since_backup >= self.save_freq and not last_of_epoch:
            self._save(self._epoch, batch)

    def on_epoch_end(self, epoch, logs=None):
        self._ended_epochs = epoch + 1

    def on_train_end(self, logs=None):
        if self.delete_checkpoint or not self.is_chief:
            if tf.io.gfile.exists(self.backup_dir):
                tf.io.gfile.rmtree(self.backup_dir)
        elif self._ended_epochs is not None:
            self._save(self._ended_epochs, -1)

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
        logs = self._train_function(iterator)
        if self._resume_metrics:
            # The metrics are built by the first step; their sums are additive.
            self._add_to_metrics(self._resume_metrics)
            logs = self.model.get_metrics_result()
        return logs

    def _add_to_metrics(self, values):
        variables = self.model.metrics_variables
        if len(variables) != len(values):
            return  # Compiled with other metrics than the backup's: the epoch's metrics start afresh.

        # In a replica context: metric sums are sync-on-read, so the first replica adds them.
        def add():
            first = tf.distribute.get_replica_context().replica_id_in_sync_group == 0
            for variable, value in zip(variables, values):
                value = tf.constant(value, variable.dtype)
                variable.assign_add(tf.where(first, value, tf.zeros_like(value)))

        self.strategy.run(add)

    def _save(self, epoch, batch):
        """Backs up the model as it is after batch `batch` of epoch `epoch` (-1: at its start)."""
        self._ended_epochs = None
        self._steps_since_backup = 0
        if not all(np.isfinite(keras.ops.convert_to_numpy(w)).all() for w in self.model.weights):
            where = f"epoch {epoch + 1}, step {batch + 1}" if batch >= 0 else f"the start of epoch {epoch + 1}"
            raise FloatingPointError(
                f"Training diverged: the weights hold NaN or Inf at {where}. They were not backed up; "
                f"{self.restore_dir} keeps the last finite backup."
            )
        state = {
            "epoch": epoch,
            "batch": batch,
            "random_state": [keras.ops.convert_to_numpy(v).tolist() for v in self._random_state()],
            "metrics": [keras.ops.convert_to_numpy(v).tolist() for v in self.model.metrics_variables]
            if batch >= 0
            else None,
        }
        latest = os.path.join(self.backup_dir, LATEST)
        if _is_local(self.backup_dir):
            # Written aside under a name of this writer's own, then renamed over the latest
            # (`kzoo.files.atomic_file`); a full disk names the backup, not the staging file.
            with files.atomic_file(latest, mode=None) as staging:
                self._write_backup(str(staging), state)
                if self.double_checkpoint and os.path.exists(latest):
                    os.replace(latest, os.path.join(self.backup_dir, PREVIOUS))
            return
        with tempfile.TemporaryDirectory() as local:
            path = os.path.join(local, LATEST)
            self._write_backup(path, state)
            tf.io.gfile.makedirs(self.backup_dir)
            tf.io.gfile.copy(path, latest + ".partial", overwrite=True)
        if self.double_checkpoint and tf.io.gfile.exists(latest):
            tf.io.gfile.rename(latest, os.path.join(self.backup_dir, PREVIOUS), overwrite=True)
        tf.io.gfile.rename(latest + ".partial", latest, overwrite=True)

    def _write_backup(self, path, state):
        """Writes the weights file `path` (local), with `state` and the LoRA variables in it."""
        self.model.save_weights(path)
        with h5py.File(path, "a") as file:
            file.attrs[_STATE_ATTRIBUTE] = json.dumps(state)
            lora = file.create_group(_LORA_GROUP)
            for name, variable in _lora_variables(self.model).items():
                lora.create_dataset(name, data=keras.ops.convert_to_numpy(variable))

    def _restore(self):
        """Loads the latest readable backup of `restore_dir` into the model; returns its state, or None."""
        for name in (LATEST, PREVIOUS):
            path = os.path.join(self.restore_dir, name)
            if not tf.io.gfile.exists(path):
                continue
            with tempfile.TemporaryDirectory() as local:
                if not _is_local(path):
                    tf.io.gfile.copy(path, os.path.join(local, name))
                    path = os.path.join(local, name)
                try:
                    with h5py.File(path, "r") as file:
                        state = json.loads(file.attrs[_STATE_ATTRIBUTE])
                except (OSError, KeyError, ValueError):
                    continue  # Unreadable: the previous backup.
                try:
                    self.model.load_weights(path)
                    with h5py.File(path, "r") as file:
                        for name, variable in _lora_variables(self.model).items():
                            variable.assign(file[_LORA_GROUP][name][()])
                except (ValueError, KeyError) as error:
                    raise ValueError(
                        f"The backup in {self.restore_dir} was written by another model or optimizer, and does not "
                        f"load into this one ({type(error).__name__}: {error}). It belongs to an unfinished run: "
                        f"rerun that run's command to resume it, or delete {self.restore_dir} to start afresh."
                    ) from error
            for variable, value in zip(self._random_state(), state["random_state"]):
                variable.assign(np.asarray(value, variable.dtype))
            return state
        return None

    def _random_state(self):
        """The model's variables that are not weights: the `SeedGenerator` states of its random layers."""
        weights = {id(weight) for weight in self.model.weights}
        return [variable for variable in self.model.variables if id(variable) not in weights]


def _lora_variables(model):
    """`{path: variable}` of the layers with LoRA on: their kernel W and their A and B.

    Keras saves such a layer's kernel merged, W + A B, and loads it back with A = B = 0 (what a
    `.keras` file for inference needs). A run resumed from that would go on from a layer whose A
    and B get no gradient: the backup keeps the three as they are.
    """
    layers = _compat.sublayers(model)
    return {
        variable.path: variable
        for layer in layers
        if getattr(layer, "lora_enabled", False)
        for variable in layer.weights
    }


def _is_local(path):
    return "://" not in str(path)
