import csv
import importlib.util
import math
import os
import shutil
import tempfile

import keras
import tensorflow as tf

from kzoo import _compat
from kzoo import files
from kzoo.training.backup_and_restore import BackupAndRestore
from kzoo.training.backup_and_restore import is_chief

HISTORY_FILE = "history.csv"


def callbacks(
    output_dir, strategy, *, backup_freq=1000, checkpoint=True, tensorboard=True, history=True, keep_backup=False
):
    """The callbacks of a recipe: stop on NaN, backup and restore, checkpoints, TensorBoard.

    Training stops with Keras' `TerminateOnNaN(raise_error=True)` on a NaN or
    Inf loss, before anything is saved from that step (a `RuntimeError`; the
    backup keeps the last finite weights). Writes `output_dir/backup` (kept
    while the run is unfinished: run the same command again to resume it;
    see `BackupAndRestore`), `output_dir/checkpoints/epoch_NNN.keras`
    (the model after each epoch, each written whole or not at all: see
    `AtomicModelCheckpoint`), `output_dir/history.csv` (one row per epoch,
    continued across resumes) and `output_dir/logs` (TensorBoard). In a
    multi-worker run only the chief writes to `output_dir`, which must be on
    storage all workers see; the other workers run the same callbacks into a
    temporary directory, deleted when `fit` ends.

    Args:
        output_dir: str, the run's directory.
        strategy: the `tf.distribute.Strategy` the model trains under.
        backup_freq: int, steps between backups (at most this many steps are
            lost when the run is killed), or "epoch".
        checkpoint: bool, save the model after each epoch.
        tensorboard: bool, write TensorBoard logs (needs the `tensorboard`
            package, which TensorFlow 2.21 no longer installs).
        history: bool, write `history.csv`.
        keep_backup: bool, keep the backup of the finished run when `fit`
            ends, for a program with more files to write (a rerun after a
            kill then restores the final weights without training); it
            deletes `output_dir/backup` itself once done.

    Returns:
        A list for `model.fit(callbacks=...)`.

    Example:
    >>> model = kzoo.models.RNNLanguageModel(vocabulary_size=128, embedding_dim=8, hidden_dim=8)
    >>> model.compile()
    >>> ids = np.random.default_rng(0).integers(1, 128, (64, 9))
    >>> stream = tf.data.Dataset.from_tensor_slices((ids[:, :-1], ids[:, 1:])).repeat().batch(8)
    >>> history = model.fit(stream, epochs=2, steps_per_epoch=4, verbose=0,
    ...                     callbacks=callbacks("callbacks_run", tf.distribute.get_strategy()))
    >>> open("callbacks_run/history.csv").readline().strip()
    'epoch,accuracy,loss,perplexity,val_accuracy,val_loss,val_perplexity'
    >>> sorted(os.listdir("callbacks_run/checkpoints"))
    ['epoch_001.keras', 'epoch_002.keras']
    """
    if tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ValueError(
            "TensorBoard logs need the `tensorboard` package: `pip install tensorboard`, or pass tensorboard=False."
        )
    chief = is_chief(strategy)
    write_dir = output_dir if chief else tempfile.mkdtemp(prefix="kzoo_worker_")
    result = [
        keras.callbacks.TerminateOnNaN(raise_error=True),
        BackupAndRestore(
            os.path.join(output_dir, "backup"),
            save_freq=backup_freq,
            strategy=strategy,
            delete_checkpoint=not keep_backup,
        ),
    ]
    if checkpoint:
        # Non-chief workers save too (see BackupAndRestore), over one file.
        name = "epoch_{epoch:03d}.keras" if chief else "checkpoint.keras"
        result.append(AtomicModelCheckpoint(os.path.join(write_dir, "checkpoints", name)))
    if history:
        result.append(ResumedCSVLogger(os.path.join(write_dir, HISTORY_FILE)))
    if tensorboard:
        result.append(keras.callbacks.TensorBoard(log_dir=os.path.join(write_dir, "logs")))
    if not chief:
        result.append(_RemoveDirectoryOnTrainEnd(write_dir))
    return result


class AtomicModelCheckpoint(_compat.ModelCheckpoint):
    """Keras' `ModelCheckpoint`, each file written beside its destination and renamed into place.

    Keras writes a checkpoint in place: a run killed, or whose disk fills, while saving leaves
    a truncated file that does not load. Here each save goes through `kzoo.files.atomic_file`:
    a failed save leaves no file (and an earlier one at that path as it was), and a full disk
    is a `kzoo.files.FileError` naming the checkpoint ("No space left on device: nothing was
    written to <path>."). Paths that are not local (`gs://...`) are saved as Keras does.

    Args:
        filepath: as Keras' (e.g. "checkpoints/epoch_{epoch:03d}.keras").
        **kwargs: Keras' `ModelCheckpoint` arguments.
    """

    def writes(self, filepath):
        return "://" not in filepath

    def write(self, filepath):
        with files.atomic_file(filepath, mode=None) as staging:
            if self.save_weights_only:
                self.model.save_weights(staging, overwrite=True)
            else:
                self.model.save(staging, overwrite=True)


class ResumedCSVLogger(keras.callbacks.CSVLogger):
    """Keras' `CSVLogger` (appending) whose file holds one row per epoch of the whole run.

    `fit` starts at epoch 0, or at the epoch a `BackupAndRestore` resumes;
    the rows of that epoch and later ones (written before a kill, and
    trained again now) are dropped when it starts, so the file never holds
    an epoch twice, and a fresh run starts a fresh file.

    Args:
        filename: a path (local, or anything `tf.io.gfile` writes).
    """

    def __init__(self, filename):
        super().__init__(filename, append=True)
        self._first_epoch = True

    def on_epoch_begin(self, epoch, logs=None):
        if self._first_epoch:
            self._first_epoch = False
            self._drop_rows_from(epoch)
        super().on_epoch_begin(epoch, logs)

    def _drop_rows_from(self, epoch):
        # The writer comes at the first epoch's end: the file can still be replaced here.
        self.csv_file.close()
        with tf.io.gfile.GFile(self.filename, "r") as file:
            lines = file.read().splitlines(keepends=True)
        kept = lines[:1] + [line for line in lines[1:] if _epoch_of(line) < epoch] if epoch > 0 else []
        if "://" in self.filename:
            with tf.io.gfile.GFile(self.filename, "w") as file:
                file.write("".join(kept))
        else:  # a kill while rewriting leaves the rows as they were
            files.write_text(self.filename, "".join(kept))
        super().on_train_begin()  # Opens the file again to append, with a header if it kept none.


def _epoch_of(line):
    """The epoch of a row of a Keras CSV log (its first column), or infinity for a torn row."""
    row = next(csv.reader([line]), None)
    return int(row[0]) if row and row[0].isdigit() else math.inf


class _RemoveDirectoryOnTrainEnd(keras.callbacks.Callback):
    """Deletes `directory` when `fit` ends; put it after the callbacks writing there."""

    def __init__(self, directory):
        super().__init__()
        self.directory = directory

    def on_train_end(self, logs=None):
        shutil.rmtree(self.directory, ignore_errors=True)
