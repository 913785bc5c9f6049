"""`kzoo.files.atomic_folder`: all or nothing, one winner among concurrent writers, links followed."""

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kzoo import files

# A writer process: fills its staging folder with its name, then waits until the other writer
# has done so too, so that both have passed every check before either moves. It loads
# kzoo/files.py by its path: importing the kzoo package would import TensorFlow.
_WRITER = """
import importlib.util, sys, time
from pathlib import Path
spec = importlib.util.spec_from_file_location("files", sys.argv[5])
files = importlib.util.module_from_spec(spec)
spec.loader.exec_module(files)
out, name, overwrite, ready = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1", Path(sys.argv[4])
try:
    with files.atomic_folder(out, overwrite) as staging:
        for i in range(3):
            (staging / f"part{i}").write_text(name)
        (ready / name).touch()
        deadline = time.monotonic() + 60
        while len(list(ready.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
except files.FolderExistsError as error:
    print(error)
    sys.exit(3)
"""


def write_concurrently(out, overwrite, ready):
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, out, name, "1" if overwrite else "0", ready, files.__file__],
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("first", "second")
    ]
    return [(process.wait(timeout=120), process.stdout.read()) for process in processes]


def contents(folder):
    return {path.name: path.read_text() for path in sorted(Path(folder).iterdir())}


def test_of_two_writers_to_one_new_folder_one_wins_and_the_other_is_told(tmp_path, tmp_path_factory):
    results = write_concurrently(tmp_path / "out", False, tmp_path_factory.mktemp("ready"))
    assert sorted(code for code, _ in results) == [0, 3]
    (message,) = [text for code, text in results if code == 3]
    assert f"{tmp_path / 'out'} was filled by another writer while this one ran" in message
    (winner,) = set(contents(tmp_path / "out").values())  # one writer's files, complete, not a mix
    assert sorted(contents(tmp_path / "out")) == ["part0", "part1", "part2"]
    assert [path.name for path in tmp_path.iterdir()] == ["out"]


def test_with_overwrite_the_last_writer_wins_whole(tmp_path, tmp_path_factory):
    results = write_concurrently(tmp_path / "out", True, tmp_path_factory.mktemp("ready"))
    assert [code for code, _ in results] == [0, 0]
    assert len(set(contents(tmp_path / "out").values())) == 1
    assert [path.name for path in tmp_path.iterdir()] == ["out"]


@pytest.mark.parametrize("target_exists", [True, False])
def test_a_link_is_followed_and_kept(tmp_path, target_exists):
    target, link = tmp_path / "target", tmp_path / "link"
    if target_exists:
        target.mkdir()
    link.symlink_to(target)
    with files.atomic_folder(link) as staging:
        (staging / "file").write_text("data")
    assert link.is_symlink() and contents(target) == {"file": "data"}
    assert sorted(path.name for path in tmp_path.iterdir()) == ["link", "target"]


def test_a_full_disk_says_so_and_leaves_nothing(tmp_path):
    out = tmp_path / "new" / "out"
    with pytest.raises(files.FolderError, match=f"No space left on device: nothing was written to {out}"):
        with files.atomic_folder(out) as staging:
            (staging / "part0").write_text("data")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert list(tmp_path.iterdir()) == []  # the parent it created is gone too


def test_a_failed_block_leaves_the_earlier_folder_as_it_was(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "earlier").write_text("kept")
    with pytest.raises(files.FolderExistsError, match="exists and is not an empty folder; choose another folder"):
        with files.atomic_folder(out):
            raise AssertionError("not reached: refused before the block")
    with pytest.raises(RuntimeError, match="interrupted"):
        with files.atomic_folder(out, overwrite=True) as staging:
            (staging / "new").write_text("half")
            raise RuntimeError("interrupted")
    assert contents(out) == {"earlier": "kept"}
    assert [path.name for path in tmp_path.iterdir()] == ["out"]


def test_under_a_file(tmp_path):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(files.FolderError, match="a_file is not a folder"):
        with files.atomic_folder(tmp_path / "a_file" / "out"):
            pass
    with pytest.raises(files.FolderError, match="a_file is a file, not a folder"):
        with files.atomic_folder(tmp_path / "a_file"):
            pass
