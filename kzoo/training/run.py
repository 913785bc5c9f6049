"""A training run that owns an output folder: it resumes where it stopped, and refuses a changed rerun.

A script that trains into a folder, run again with the same command, should go on where the
last attempt stopped (killed mid-epoch, or after training while writing its files), and one
run with other settings should not mix its files with the first one's. `Run` keeps that
contract through the files it leaves in `output_dir`:

- `.lock` (`LOCK_FILE`): held (`flock`) by the process writing into the folder, and naming it;
  a second run refuses the folder (`RunFolderInUse`). The system releases the lock when the
  process ends, however it ends.
- `unfinished_run.json` (`UNFINISHED_RUN_FILE`): the settings of the run whose backups
  (`backup/`, see `BackupAndRestore`) the folder holds while it is unfinished. The same
  settings resume it; other settings are refused, naming them (`ChangedRunError`).
- `metrics.json` (`METRICS_FILE`): written by `Run.finish`, with the final metrics, the
  settings and the wall time. A rerun with other settings is refused, naming them; one with
  the same settings has nothing to train (`Run.check` returns the record).
- `checkpoints/`, `logs/` and `history.csv` from `callbacks`, and `model.keras` (`MODEL_FILE`)
  from `Run.save`.

Every file is written whole or not at all (`kzoo.files.atomic_file`). A run file torn all the
same (empty, cut short: a full disk under an older kzoo) is treated as missing, with a message.
`overwrite=True` starts afresh whatever the folder holds. Nothing is written before `Run.claim`
(which `path`, `folder`, `fit`, `save` and `finish` call): a run refused before then leaves no
folder behind.

Example:
>>> settings = {"units": 1, "epochs": 1}
>>> run = Run("run_example", settings)
>>> run.check() is None  # a new folder: nothing to refuse, nothing finished
True
>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
>>> model.compile(loss="mse")
>>> stream = tf.data.Dataset.from_tensor_slices((np.ones((8, 2)), np.ones((8, 1)))).repeat().batch(4)
>>> history = run.fit(model, stream, epochs=1, steps_per_epoch=2, verbose=0)
>>> sorted(os.listdir("run_example"))  # the backup and the record of an unfinished run
['.lock', 'backup', 'checkpoints', 'history.csv', 'logs', 'unfinished_run.json']
>>> record = run.finish({"loss": history["loss"][-1]})
>>> sorted(os.listdir("run_example"))
['.lock', 'checkpoints', 'history.csv', 'logs', 'metrics.json']
>>> Run("run_example", settings).check()["settings"]  # finished: nothing to train
{'units': 1, 'epochs': 1}
>>> Run("run_example", {"units": 2, "epochs": 1}).check()
Traceback (most recent call last):
...
kzoo.training.run.ChangedRunError: run_example holds a finished run of other settings, ...: units 1 (now 2). ...
"""

import csv
import fcntl
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

import tensorflow as tf

# Through the package, at call time: `kzoo.training.callbacks` is the function a user's script
# calls, and what a program wrapping it (adding a callback) replaces.
import kzoo.training
from kzoo import files
from kzoo.training.backup_and_restore import is_chief
from kzoo.training.callbacks import HISTORY_FILE
from kzoo.training.sharding import shard_by_data

METRICS_FILE = "metrics.json"
MODEL_FILE = "model.keras"
# The settings of the run whose backups the output folder holds, while it is unfinished.
UNFINISHED_RUN_FILE = "unfinished_run.json"
# Held (flock) by the run writing into the output folder; names it.
LOCK_FILE = ".lock"
# The folder of `BackupAndRestore` in the folder of each model a run fits.
BACKUP_FOLDER = "backup"
# Steps between backups: at most this many steps are trained again after a kill.
BACKUP_FREQ = 200
# Tries at the lock of a folder that `check_lock` of another run tests for an instant.
_LOCK_TRIES = 10


class RunFolderError(ValueError):
    """An output folder a run cannot use as asked; nothing was written to it.

    Attributes:
        output_dir: `Path`, the folder.
    """

    def __init__(self, message, output_dir):
        super().__init__(message)
        self.output_dir = Path(output_dir)


class RunFolderInUse(RunFolderError):
    """Another process holds the output folder (its `.lock`).

    Attributes:
        holder: str, what the lock file says of the process holding it.
    """

    def __init__(self, output_dir, holder):
        super().__init__(
            f"{output_dir} is in use by another run: {holder}. Wait for it to end, or use another folder.", output_dir
        )
        self.holder = holder


class ChangedRunError(RunFolderError):
    """The output folder holds a run of other settings: unfinished (its backups) or finished.

    Attributes:
        changes: dict, setting name -> `(earlier value, value now)`, of the settings that differ.
        backups: list of str, the backup folders of an unfinished run; empty for a finished one.
    """

    def __init__(self, output_dir, changes, backups):
        changed = describe_changes(changes)
        if backups:
            message = (
                f"{output_dir} holds the backup of an unfinished run of other settings, so it belongs to another "
                f"model or training: {changed}. Rerun it with its settings to resume it, or delete "
                f"{' and '.join(backups)} (or use another folder, or overwrite=True) to start afresh."
            )
        else:
            message = (
                f"{output_dir} holds a finished run of other settings, whose files this run would replace: "
                f"{changed}. Use another folder, or overwrite=True to replace it."
            )
        super().__init__(message, output_dir)
        self.changes = changes
        self.backups = backups


class RunFinished(RunFolderError):
    """The output folder holds a finished run of the same settings: there is nothing to train.

    Attributes:
        record: dict, its `metrics.json`.
    """

    def __init__(self, output_dir, record):
        super().__init__(
            f"{output_dir} holds a finished run of these settings: nothing to train. Pass overwrite=True to "
            "train again.",
            output_dir,
        )
        self.record = record


class Run:
    """One training run into `output_dir`: its lock, its resumption, and the files it writes.

    Build and compile the model under `strategy.scope()`, train with `fit` (as often as the run
    has models, each in a folder of its own), save with `save`, and end with `finish`, which
    writes `metrics.json` and removes what only a resumption needs. In a multi-worker run only
    the chief writes into `output_dir`, which must be on storage every worker sees.

    Args:
        output_dir: str or `Path`, the run's folder (created, with its parents, by `claim`).
        settings: dict of JSON-serializable values that make the run the one it is (model,
            data, training); a rerun with other values is refused, naming them.
        strategy: the `tf.distribute.Strategy` the model trains under; None: the default.
        resumable: names of `settings` that a rerun may change and still resume or find the
            run finished: where things are, and how the same computation runs.
        overwrite: bool, start afresh whatever the folder holds (the earlier run's backups and
            `metrics.json` are deleted when the run claims the folder).
        backup_freq: int, training steps between backups, or "epoch".
    """

    def __init__(self, output_dir, settings, strategy=None, resumable=(), overwrite=False, backup_freq=BACKUP_FREQ):
        self.output_dir = Path(output_dir)
        self.settings = dict(settings)
        self.strategy = strategy or tf.distribute.get_strategy()
        self.resumable = tuple(resumable)
        self.overwrite = overwrite
        self.backup_freq = backup_freq
        self.is_chief = is_chief(self.strategy)
        self.start_time = time.monotonic()
        self.lock = None
        self._claimed = False
        self._fitted_folders = []

    def check(self):
        """Checks the folder against the run it may hold, and reads only.

        Returns:
            None for a new run (or a resumed one, or under `overwrite`); the `metrics.json`
            record of a finished run of the same settings, which has nothing to train.

        Raises:
            RunFolderInUse: another process holds the folder.
            ChangedRunError: the folder holds a run of other settings.
        """
        if not self.is_chief:
            return None
        check_lock(self.output_dir)
        return check_earlier_run(self.output_dir, self.settings, self.resumable, self.overwrite)

    def claim(self):
        """Creates and locks the folder and records the run there, once (`path`, `folder`, `fit`,
        `save` and `finish` call it); under `overwrite` the earlier run's backups and
        `metrics.json` go first.

        Raises:
            RunFolderInUse, ChangedRunError: as `check`, now under the lock.
            RunFinished: the folder holds a finished run of the same settings.
            kzoo.files.FolderError: the folder cannot be created or locked.
        """
        if self._claimed or not self.is_chief:
            return
        try:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self.lock = lock_output_dir(self.output_dir)
        except OSError as error:
            raise files.FolderError(f"Cannot write into {self.output_dir}: {error.strerror}.") from error
        try:
            finished = check_earlier_run(self.output_dir, self.settings, self.resumable, self.overwrite)
            if finished is not None:
                raise RunFinished(self.output_dir, finished)
            if self.overwrite:
                for backup in _backups(self.output_dir):
                    shutil.rmtree(backup)
                (self.output_dir / METRICS_FILE).unlink(missing_ok=True)
            files.write_json(self.output_dir / UNFINISHED_RUN_FILE, self.settings)
        except BaseException:
            self.release()
            raise
        self._claimed = True

    def path(self, name):
        """The path of the file `name` in the output folder, which the run claims first."""
        self.claim()
        return self.output_dir / name

    def folder(self, name=None):
        """The output folder, or its subfolder `name` (for one of several models); the run
        claims the folder first."""
        self.claim()
        return self.output_dir if name is None else self.output_dir / name

    def write_json(self, name, value):
        """Writes `value` to the JSON file `name` of the output folder, whole or not at all (the chief alone)."""
        if self.is_chief:
            files.write_json(self.path(name), value)

    def fit(self, model, stream, epochs, steps_per_epoch, validation_data=None, name=None, **kwargs):
        """`model.fit` over the repeated `stream`, with backups, checkpoints, logs and `history.csv`.

        A run with a backup resumes from it (the step it stopped at, its weights, optimizer and
        data position; see `BackupAndRestore`); without one, the checkpoints and logs of an
        earlier run go first. The backup is kept when `fit` ends: `finish` deletes it once every
        file of the run is written, so a run killed after training resumes without training again.

        Args:
            model: a compiled model.
            stream: a `tf.data.Dataset` of training batches that never ends (`.repeat()`) and
                yields the same batches on every run (seeded); each worker keeps its part of
                every global batch (`shard_by_data`).
            epochs: int.
            steps_per_epoch: int.
            validation_data: None or a finite dataset, evaluated after each epoch.
            name: None, or a subfolder of the output folder for this model's files, for a run
                that trains several.
            **kwargs: more `model.fit` arguments (`verbose`: 1 on the chief, 0 elsewhere, unless given).

        Returns:
            The history of the whole run, resumed epochs included, as `{metric: [per epoch]}`
            (other workers of a multi-worker run: the epochs they ran).
        """
        folder = self.folder(name)
        if self.is_chief:
            folder.mkdir(parents=True, exist_ok=True)
            self._fitted_folders.append(folder)
            if not (folder / BACKUP_FOLDER).is_dir():  # a fresh start: no file of an earlier run stays
                for earlier in ("checkpoints", "logs"):
                    shutil.rmtree(folder / earlier, ignore_errors=True)
        run_callbacks = kzoo.training.callbacks(
            str(folder), self.strategy, backup_freq=self.backup_freq, keep_backup=True
        )
        kwargs.setdefault("verbose", 1 if self.is_chief else 0)
        history = model.fit(
            shard_by_data(stream),
            epochs=epochs,
            steps_per_epoch=steps_per_epoch,
            validation_data=validation_data,
            callbacks=run_callbacks,
            shuffle=False,  # The stream is shuffled already; Keras cannot shuffle a dataset.
            **kwargs,
        )
        return read_history(folder / HISTORY_FILE) if self.is_chief else history.history

    def save(self, model, name=None):
        """Saves `model` as `model.keras` in `folder(name)`, whole or not at all.

        Every worker saves, as saving may read variables through collectives, but only the
        chief into the output folder; the others into a temporary folder.

        Returns:
            The path of `model.keras`.
        """
        folder = self.folder(name) if self.is_chief else Path(tempfile.mkdtemp(prefix="kzoo_save_"))
        with files.atomic_file(folder / MODEL_FILE, mode=None) as staging:
            model.save(staging)
        return folder / MODEL_FILE

    def finish(self, metrics, **fields):
        """Ends the run: writes `metrics.json`, then removes the backups, the unfinished-run
        record and the lock. A run killed before `metrics.json` is written resumes (from its
        final backup, training nothing again).

        Args:
            metrics: dict of the final metrics (JSON-serializable).
            **fields: more JSON-serializable entries of the record (e.g. `history`).

        Returns:
            The record written to `metrics.json`: `metrics`, `wall_time_s` (since the `Run` was
            made), `settings` and `fields`.
        """
        record = {
            **fields,
            "metrics": metrics,
            "wall_time_s": round(time.monotonic() - self.start_time, 1),
            "settings": self.settings,
        }
        if self.is_chief:
            self.write_json(METRICS_FILE, record)
            for folder in self._fitted_folders:
                shutil.rmtree(folder / BACKUP_FOLDER, ignore_errors=True)
            (self.output_dir / UNFINISHED_RUN_FILE).unlink(missing_ok=True)
            self.release()
        return record

    def release(self):
        """Releases the folder's lock (the run's end does too, however it ends)."""
        if self.lock is not None:
            self.lock.close()
            self.lock = None


def check_lock(output_dir):
    """Raises `RunFolderInUse` if another process holds `output_dir`; creates nothing."""
    try:
        file = open(Path(output_dir) / LOCK_FILE)  # noqa: SIM115 (closed below)
    except OSError:
        return  # no lock file: no run holds the folder
    with file:
        try:  # a shared lock, released at once: it only tests for a holder
            fcntl.flock(file, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunFolderInUse(output_dir, _holder(file)) from None


def lock_output_dir(output_dir):
    """Takes `output_dir` for this process (an `flock` on its `.lock`, which names the process).

    Returns:
        The open lock file: the lock lasts while it is open, and the system releases it when
        the process ends, however it ends.

    Raises:
        RunFolderInUse: another process holds it.
    """
    file = open(Path(output_dir) / LOCK_FILE, "a+")  # noqa: SIM115 (the lock lasts while the file is open)
    for attempt in range(_LOCK_TRIES):
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if attempt == _LOCK_TRIES - 1:
                holder = _holder(file)
                file.close()
                raise RunFolderInUse(output_dir, holder) from None
            time.sleep(0.02)  # another run's `check_lock` holds it for an instant
    file.truncate(0)
    file.write(f"pid {os.getpid()} on {socket.gethostname()}, running {' '.join(sys.argv)}\n")
    file.flush()
    return file


def _holder(file):
    file.seek(0)
    return file.read().strip() or "another process"


def check_earlier_run(output_dir, settings, resumable=(), overwrite=False):
    """Checks `output_dir` against the run it may hold; reads only.

    - The backup of an unfinished run (`UNFINISHED_RUN_FILE` records its settings): the same
      settings resume it; other settings are refused.
    - A finished run (its `METRICS_FILE`): other settings are refused, as its files would be
      replaced; the same settings have nothing to train.
    - `overwrite`: a run starts afresh whatever the folder holds.

    A torn record (empty, cut short) counts as missing (`read_record`).

    Args:
        output_dir: str or `Path`.
        settings: dict, the settings of the run now.
        resumable: names of settings that may differ (see `Run`).
        overwrite: bool.

    Returns:
        The `metrics.json` record of a finished run of the same settings, else None.

    Raises:
        ChangedRunError: the folder holds a run of other settings, naming them.
    """
    if overwrite:
        return None
    output_dir = Path(output_dir)
    backups = _backups(output_dir)
    earlier = read_record(output_dir / UNFINISHED_RUN_FILE) if backups else None
    if earlier is not None:
        changes = changed_settings(earlier, settings, resumable)
        if changes:
            raise ChangedRunError(output_dir, changes, backups)
        return None
    record = read_record(output_dir / METRICS_FILE, ("metrics", "wall_time_s"))
    if record is not None:
        changes = changed_settings(record.get("settings", {}), settings, resumable)
        if changes:
            raise ChangedRunError(output_dir, changes, [])
    return record


def changed_settings(earlier, settings, resumable=()):
    """The `settings` that differ from the `earlier` run's, but those named in `resumable`.

    Returns:
        A dict, name -> `(earlier value or None, value now)`, in the order of `settings`.

    Example:
    >>> changed_settings({"preset": "gpt_tiny", "seed": 0}, {"preset": "gpt_small", "seed": 0})
    {'preset': ('gpt_tiny', 'gpt_small')}
    """
    return {
        key: (earlier.get(key), value)
        for key, value in settings.items()
        if key not in resumable and earlier.get(key) != value
    }


def describe_changes(changes, name=str):
    """`changed_settings`'s changes as "name earlier (now value), ...", each name through `name`.

    Example:
    >>> describe_changes({"learning_rate": (0.1, 0.01)}, name=lambda key: "--" + key.replace("_", "-"))
    '--learning-rate 0.1 (now 0.01)'
    """
    return ", ".join(f"{name(key)} {earlier} (now {value})" for key, (earlier, value) in changes.items())


def read_record(path, keys=()):
    """The JSON object of a run's file (`metrics.json`, `unfinished_run.json`, ...), or None.

    None when the file is missing, and when it is torn (empty, cut short, not a JSON object, or
    without one of `keys`), as a disk that filled up or an older kzoo could leave it: a message
    names it, and the run goes on as without it.
    """
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        record = None
    if not isinstance(record, dict) or any(key not in record for key in keys):
        print(f"{path} is torn (empty, cut short or not the record it should be): treated as missing.")
        return None
    return record


def read_history(path):
    """`history.csv` as `{column: [values]}`, numbers as floats.

    Keras' `CSVLogger` writes the validation columns of a run without validation too, each
    value "NA": such columns are left out.
    """
    with open(path, newline="") as file:
        rows = list(csv.DictReader(file))
    columns = [key for key in (rows[0] if rows else {}) if any(row[key] != "NA" for row in rows)]
    return {key: [float(row[key]) for row in rows] for key in columns}


def _backups(output_dir):
    return sorted(str(backup) for backup in Path(output_dir).glob(f"**/{BACKUP_FOLDER}") if backup.is_dir())
