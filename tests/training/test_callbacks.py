"""The files `kzoo.training.callbacks` writes land whole: a save that fails (a full disk) leaves no
truncated checkpoint or backup, and says which file could not be written."""

import errno
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import kzoo.models
import kzoo.training
from kzoo import files


class StopInEpoch2(keras.callbacks.Callback):
    """Ends the run in its second epoch, after the backup of the first, as if it were killed."""

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1:
            raise KeyboardInterrupt


def tiny_fit(output_dir, extra_callbacks=(), **kwargs):
    keras.utils.set_random_seed(0)
    model = kzoo.models.RNNLanguageModel(vocabulary_size=32, embedding_dim=4, hidden_dim=4)
    model.compile(run_eagerly=True)  # four eager steps cost less than tracing a train step; the files are the point
    ids = np.random.default_rng(0).integers(1, 32, (16, 5))
    stream = tf.data.Dataset.from_tensor_slices((ids[:, :-1], ids[:, 1:])).repeat().batch(4)
    callbacks = kzoo.training.callbacks(str(output_dir), tf.distribute.get_strategy(), tensorboard=False, **kwargs)
    callbacks += list(extra_callbacks)
    model.fit(stream, epochs=2, steps_per_epoch=2, verbose=0, callbacks=callbacks, shuffle=False)


def filling_disk(real):
    """`real` (a save by path) that writes part of its file, then finds the disk full."""

    def save(self, filepath, *args, **kwargs):
        with open(filepath, "wb") as file:
            file.write(b"PK\x03\x04 the first bytes of a zip")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    return save


def test_a_checkpoint_save_that_fills_the_disk_leaves_no_truncated_file(tmp_path, monkeypatch):
    monkeypatch.setattr(kzoo.models.RNNLanguageModel, "save", filling_disk(keras.Model.save))
    checkpoint = tmp_path / "checkpoints" / "epoch_001.keras"
    with pytest.raises(files.FileError) as raised:
        tiny_fit(tmp_path)
    assert str(raised.value) == f"No space left on device: nothing was written to {checkpoint}."
    assert not (tmp_path / "checkpoints").exists()  # nor the folder made for it
    monkeypatch.undo()
    (tmp_path / "whole").mkdir()
    tiny_fit(tmp_path / "whole")
    assert sorted(os.listdir(tmp_path / "whole" / "checkpoints")) == ["epoch_001.keras", "epoch_002.keras"]
    keras.saving.load_model(tmp_path / "whole" / "checkpoints" / "epoch_002.keras")


def test_a_backup_that_fills_the_disk_keeps_the_last_whole_backup(tmp_path, monkeypatch):
    with pytest.raises(KeyboardInterrupt):
        tiny_fit(tmp_path, [StopInEpoch2()], backup_freq="epoch")
    latest = tmp_path / "backup" / "latest.weights.h5"
    before = latest.read_bytes()
    monkeypatch.setattr(kzoo.models.RNNLanguageModel, "save_weights", filling_disk(keras.Model.save_weights))
    with pytest.raises(files.FileError) as raised:
        tiny_fit(tmp_path, backup_freq="epoch", keep_backup=True)  # resumes at epoch 2, backs up at its end
    assert str(raised.value) == f"No space left on device: nothing was written to {latest}."
    assert latest.read_bytes() == before
    assert sorted(os.listdir(tmp_path / "backup")) == ["latest.weights.h5"]
