import importlib.util
import os
import shutil
import tempfile

import keras

from kzoo.training.backup_and_restore import BackupAndRestore
from kzoo.training.backup_and_restore import is_chief


def callbacks(output_dir, strategy, *, backup_freq=1000, checkpoint=True, tensorboard=True):
    """The callbacks of a recipe: backup and restore, checkpoints, TensorBoard.

    Writes `output_dir/backup` (kept while the run is unfinished: run the
    same command again to resume it), `output_dir/checkpoints/epoch_NNN.keras`
    (the model after each epoch) and `output_dir/logs` (TensorBoard). In a
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

    Returns:
        A list for `model.fit(callbacks=...)`.

    Example:
    >>> model.fit(stream, epochs=10, steps_per_epoch=1000,
    ...           callbacks=kzoo.training.callbacks("/tmp/run", config.strategy))
    """
    if tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ValueError(
            "TensorBoard logs need the `tensorboard` package: `pip install tensorboard`, or pass tensorboard=False."
        )
    chief = is_chief(strategy)
    write_dir = output_dir if chief else tempfile.mkdtemp(prefix="kzoo_worker_")
    result = [BackupAndRestore(os.path.join(output_dir, "backup"), save_freq=backup_freq, strategy=strategy)]
    if checkpoint:
        # Non-chief workers save too (see BackupAndRestore), over one file.
        name = "epoch_{epoch:03d}.keras" if chief else "checkpoint.keras"
        result.append(keras.callbacks.ModelCheckpoint(os.path.join(write_dir, "checkpoints", name)))
    if tensorboard:
        result.append(keras.callbacks.TensorBoard(log_dir=os.path.join(write_dir, "logs")))
    if not chief:
        result.append(_RemoveDirectoryOnTrainEnd(write_dir))
    return result


class _RemoveDirectoryOnTrainEnd(keras.callbacks.Callback):
    """Deletes `directory` when `fit` ends; put it after the callbacks writing there."""

    def __init__(self, directory):
        super().__init__()
        self.directory = directory

    def on_train_end(self, logs=None):
        shutil.rmtree(self.directory, ignore_errors=True)
