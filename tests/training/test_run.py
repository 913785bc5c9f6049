"""kzoo.training.Run, without training: the folder's lock, refusing a changed rerun, resuming an
unfinished run, a torn record, and what `finish` writes and removes."""

import json
import subprocess
import sys

import pytest

import kzoo.training
from kzoo import files
from kzoo.training import run as run_module

SETTINGS = {"preset": "gpt_tiny", "learning_rate": 0.01, "output_dir": "a"}


def test_a_folder_held_by_another_process_is_refused_naming_it(tmp_path):
    (tmp_path / ".lock").write_text("pid 4242 on otherhost, running train.py\n")
    holder = subprocess.Popen(
        [sys.executable, "-c", (f"import fcntl, time; f = open({str(tmp_path / '.lock')!r}); "
         "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        for attempt in (kzoo.training.Run(tmp_path, SETTINGS).check, kzoo.training.Run(tmp_path, SETTINGS).claim):
            with pytest.raises(kzoo.training.RunFolderInUse, match="in use by another run: pid 4242 on otherhost"):
                attempt()
        assert sorted(path.name for path in tmp_path.iterdir()) == [".lock"]
    finally:
        holder.kill()
        holder.wait()
    run = kzoo.training.Run(tmp_path, SETTINGS)
    run.claim()  # the holder is gone: the folder is free
    assert "pid " in (tmp_path / ".lock").read_text()
    run.release()


def test_a_changed_rerun_is_refused_naming_the_setting(tmp_path):
    (tmp_path / "backup").mkdir()
    (tmp_path / "unfinished_run.json").write_text(json.dumps(SETTINGS))
    changed = {**SETTINGS, "learning_rate": 0.1, "output_dir": "b"}  # output_dir: resumable
    run = kzoo.training.Run(tmp_path, changed, resumable=("output_dir",))
    with pytest.raises(
        kzoo.training.ChangedRunError, match=r"unfinished run .*: learning_rate 0.01 \(now 0.1\)\."
    ) as info:
        run.check()
    assert info.value.changes == {"learning_rate": (0.01, 0.1)}
    assert info.value.backups == [str(tmp_path / "backup")]
    with pytest.raises(kzoo.training.ChangedRunError):
        run.claim()  # again under the lock, which it then releases
    assert run.lock is None
    assert json.loads((tmp_path / "unfinished_run.json").read_text()) == SETTINGS

    (tmp_path / "backup").rmdir()
    files.write_json(tmp_path / "metrics.json", {"metrics": {}, "wall_time_s": 1, "settings": SETTINGS})
    with pytest.raises(kzoo.training.ChangedRunError, match=r"finished run .*: learning_rate 0.01 \(now 0.1\)"):
        run.check()
    assert kzoo.training.Run(tmp_path, changed, overwrite=True).check() is None


def test_an_unfinished_run_of_the_same_settings_resumes(tmp_path):
    (tmp_path / "backup").mkdir()
    (tmp_path / "unfinished_run.json").write_text(json.dumps(SETTINGS))
    (tmp_path / "metrics.json").write_text(json.dumps({"metrics": {}, "wall_time_s": 1, "settings": {}}))
    run = kzoo.training.Run(tmp_path, {**SETTINGS, "output_dir": "b"}, resumable=("output_dir",))
    assert run.check() is None  # the backup's record wins over an older metrics.json
    run.claim()
    assert (tmp_path / "backup").is_dir()
    assert json.loads((tmp_path / "unfinished_run.json").read_text())["output_dir"] == "b"
    run.release()


def test_a_finished_run_of_the_same_settings_has_nothing_to_train(tmp_path):
    record = {"metrics": {"loss": 1.0}, "wall_time_s": 1, "settings": SETTINGS}
    files.write_json(tmp_path / "metrics.json", record)
    assert kzoo.training.Run(tmp_path, SETTINGS).check() == record
    with pytest.raises(kzoo.training.RunFinished) as info:
        kzoo.training.Run(tmp_path, SETTINGS).claim()
    assert info.value.record == record


@pytest.mark.parametrize("text", ["", '{"preset": "gpt_ti', "[1, 2]", "\xff"])
def test_a_torn_record_is_treated_as_missing_with_a_message(tmp_path, capsys, text):
    (tmp_path / "backup").mkdir()
    (tmp_path / "unfinished_run.json").write_bytes(text.encode("latin-1"))
    (tmp_path / "metrics.json").write_text('{"metrics": {}}')  # no wall_time_s: torn too
    assert kzoo.training.Run(tmp_path, {**SETTINGS, "preset": "other"}).check() is None
    out = capsys.readouterr().out
    assert f"{tmp_path / 'unfinished_run.json'} is torn (empty, cut short" in out
    assert f"{tmp_path / 'metrics.json'} is torn" in out


def test_nothing_is_written_before_the_run_claims_its_folder(tmp_path):
    run = kzoo.training.Run(tmp_path / "new" / "run", SETTINGS)
    assert run.check() is None
    assert list(tmp_path.iterdir()) == []
    assert run.path("model.keras") == tmp_path / "new" / "run" / "model.keras"
    assert json.loads((tmp_path / "new" / "run" / "unfinished_run.json").read_text()) == SETTINGS
    run.release()


def test_overwrite_deletes_the_earlier_run_when_it_claims_the_folder(tmp_path):
    (tmp_path / "model" / "backup").mkdir(parents=True)
    (tmp_path / "unfinished_run.json").write_text(json.dumps(SETTINGS))
    (tmp_path / "metrics.json").write_text("{}")
    run = kzoo.training.Run(tmp_path, {**SETTINGS, "preset": "other"}, overwrite=True)
    assert run.check() is None
    assert (tmp_path / "model" / "backup").is_dir()  # checking deletes nothing
    run.claim()
    assert not (tmp_path / "model" / "backup").exists() and not (tmp_path / "metrics.json").exists()
    assert json.loads((tmp_path / "unfinished_run.json").read_text())["preset"] == "other"
    run.release()


def test_finish_writes_metrics_atomically_and_removes_the_backups_and_the_record(tmp_path, monkeypatch):
    run = kzoo.training.Run(tmp_path, SETTINGS)
    run.claim()
    for name in ("first", "second"):  # two models fitted, each with its backup (as `fit` leaves it)
        (run.folder(name) / "backup").mkdir(parents=True)
        run._fitted_folders.append(run.folder(name))
    written = []
    real_write_json = files.write_json
    monkeypatch.setattr(files, "write_json", lambda path, value: written.append(path) or real_write_json(path, value))
    record = run.finish({"loss": 0.5}, history={"first": {"loss": [1.0, 0.5]}})
    assert written == [tmp_path / "metrics.json"]  # through kzoo.files: whole or not at all
    assert json.loads((tmp_path / "metrics.json").read_text()) == record
    assert record["metrics"] == {"loss": 0.5} and record["settings"] == SETTINGS
    assert record["history"] == {"first": {"loss": [1.0, 0.5]}} and record["wall_time_s"] >= 0
    assert sorted(str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*")) == [
        ".lock", "first", "metrics.json", "second"
    ]  # fmt: skip
    assert run.lock is None
    with pytest.raises(kzoo.training.RunFinished):
        kzoo.training.Run(tmp_path, SETTINGS).claim()  # the lock is free, and the run finished


def test_a_metrics_file_that_cannot_be_written_leaves_the_run_resumable(tmp_path, monkeypatch):
    run = kzoo.training.Run(tmp_path, SETTINGS)
    run.claim()
    (tmp_path / "backup").mkdir()
    run._fitted_folders.append(tmp_path)

    def full_disk(path, value):
        raise files.FileError(f"No space left on device: nothing was written to {path}.")

    monkeypatch.setattr(run_module.files, "write_json", full_disk)
    with pytest.raises(files.FileError):
        run.finish({"loss": 0.5})
    assert (tmp_path / "backup").is_dir() and (tmp_path / "unfinished_run.json").is_file()
    assert not (tmp_path / "metrics.json").exists()
    run.release()
