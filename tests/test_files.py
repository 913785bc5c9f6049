"""`kzoo.files.atomic_folder` and `atomic_file`: all or nothing, one winner among concurrent
writers, links followed, a full or read-only disk named by the user's path."""

import errno
import os
import socket
import subprocess
import sys
import tempfile
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


# `atomic_file`: one file, all or nothing.

# A writer process: writes its name into its staging file in pieces, then waits until the other
# writer is mid-write too, so that both write at once; prints its staging file's path.
_FILE_WRITER = """
import importlib.util, sys, time
from pathlib import Path
spec = importlib.util.spec_from_file_location("files", sys.argv[4])
files = importlib.util.module_from_spec(spec)
spec.loader.exec_module(files)
out, name, ready = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
with files.atomic_file(out) as file:
    print(file.name, flush=True)
    for i in range(1000):
        file.write(name.encode() * 10)
        if i == 500:
            file.flush()
            (ready / name).touch()
            deadline = time.monotonic() + 60
            while len(list(ready.iterdir())) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
"""


def test_two_writers_to_one_file_write_apart_and_one_wins_whole(tmp_path, tmp_path_factory):
    out, ready = tmp_path / "model.bin", tmp_path_factory.mktemp("ready")
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _FILE_WRITER, out, name, ready, files.__file__], stdout=subprocess.PIPE, text=True
        )
        for name in ("first", "second")
    ]
    results = [(process.wait(timeout=120), process.stdout.read().strip()) for process in processes]
    assert [code for code, _ in results] == [0, 0]
    stagings = [Path(path) for _, path in results]
    assert stagings[0] != stagings[1]
    for staging, process in zip(stagings, processes):  # .<name>.<host>-<pid>.<random>.partial/<name>
        assert staging.name == "model.bin" and staging.parent.parent == tmp_path
        assert staging.parent.name.startswith(f".model.bin.{socket.gethostname()}-{process.pid}.")
        assert staging.parent.name.endswith(".partial")
    assert out.read_bytes() in (b"first" * 10_000, b"second" * 10_000)
    assert [path.name for path in tmp_path.iterdir()] == ["model.bin"]


def test_a_file_is_written_whole_in_each_mode(tmp_path):
    with files.atomic_file(tmp_path / "a.bin") as file:
        file.write(b"\x00\x01")
    files.write_text(tmp_path / "sub" / "b.txt", "héllo")
    files.write_json(tmp_path / "c.json", {"a": [1]})
    with files.atomic_file(tmp_path / "d.keras", mode=None) as staging:
        assert staging.name == "d.keras"  # libraries that read the format from the suffix see it
        staging.write_text("by name")
    assert contents(tmp_path / "sub") == {"b.txt": "héllo"}
    assert (tmp_path / "a.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "c.json").read_text() == '{\n  "a": [\n    1\n  ]\n}\n'
    assert (tmp_path / "d.keras").read_text() == "by name"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a.bin", "c.json", "d.keras", "sub"]
    with pytest.raises(files.FileError, match="Nothing was written to .*e.keras: the writer made no file"):
        with files.atomic_file(tmp_path / "e.keras", mode=None):
            pass
    with pytest.raises(ValueError, match="`mode` must be 'wb', 'w' or None .*received mode='a'"):
        with files.atomic_file(tmp_path / "f", mode="a"):
            pass


def test_a_failed_file_write_leaves_the_earlier_file_as_it_was(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("earlier")
    with pytest.raises(RuntimeError, match="interrupted"):
        with files.atomic_file(out, "w") as file:
            file.write("half")
            raise RuntimeError("interrupted")
    with pytest.raises(files.ExistingFileError, match="out.txt exists; pass overwrite=True"):
        files.write_text(out, "new", overwrite=False)
    assert out.read_text() == "earlier"
    assert [path.name for path in tmp_path.iterdir()] == ["out.txt"]


def test_a_full_disk_names_the_file_and_leaves_nothing(tmp_path, monkeypatch):
    """As the disk fills, the write or the flush to the disk fails (ENOSPC, without a file name):
    the message names the user's file, and nothing is left, the earlier file as it was."""
    out = tmp_path / "new" / "out.json"
    with pytest.raises(files.FileError, match=f"^No space left on device: nothing was written to {out}.$"):
        with files.atomic_file(out) as file:
            file.write(b"data")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert list(tmp_path.iterdir()) == []  # the parent it created is gone too

    kept = tmp_path / "kept.json"
    kept.write_text("earlier")

    def fsync(descriptor):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(files.FileError, match=f"^No space left on device: nothing was written to {kept}.$"):
        files.write_json(kept, {"a": 1})
    assert kept.read_text() == "earlier"
    assert [path.name for path in tmp_path.iterdir()] == ["kept.json"]


def test_a_read_only_place_names_the_file_not_the_staging_file(tmp_path, monkeypatch):
    """Tests run as root, for whom modes do not stop writes: the system's errors are raised
    where a read-only filesystem and a folder without write permission raise them."""
    out = tmp_path / "out.gguf"

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(tmp_path))

    with monkeypatch.context() as patches:
        patches.setattr(tempfile, "mkdtemp", read_only)
        with pytest.raises(files.FileError, match=f"^Read-only file system: nothing was written to {out}.$"):
            files.write_text(out, "data")
    with pytest.raises(files.FileError, match=f"^Permission denied: nothing was written to {out}.$"):
        with files.atomic_file(out, mode=None) as staging:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(staging))
    with pytest.raises(files.FolderError, match=f"^Read-only file system: nothing was written to {out}.$"):
        with files.atomic_folder(out) as staging:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(staging / "weights"))
    # A file the block reads is not the destination: its error stays as it is.
    with pytest.raises(PermissionError, match="elsewhere"):
        with files.atomic_file(out):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(tmp_path / "elsewhere"))
    assert list(tmp_path.iterdir()) == []


def test_a_loop_of_links_or_a_folder_is_named(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(files.FileError, match=f"Cannot write {loop}: it is a loop of symbolic links"):
        files.write_text(loop, "data")
    with pytest.raises(files.FolderError, match=f"Cannot write {loop / 'out'}: it is a loop of symbolic links"):
        with files.atomic_folder(loop / "out"):
            pass
    (tmp_path / "folder").mkdir()
    with pytest.raises(files.FileError, match="folder is a folder, not a file"):
        files.write_text(tmp_path / "folder", "data")
    (tmp_path / "a_file").write_text("")
    with pytest.raises(files.FileError, match="its parent .*a_file is not a folder"):
        files.write_text(tmp_path / "a_file" / "out", "data")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a_file", "folder", "loop"]


def test_a_killed_writer_s_staging_file_is_removed_by_the_next(tmp_path):
    killed = tmp_path / f".out.bin.{socket.gethostname()}-{2**22 + 1}.abc123.partial"  # above Linux's pid_max
    killed.mkdir()
    (killed / "out.bin").write_bytes(b"half")
    files.write_text(tmp_path / "out.bin", "whole")
    assert [path.name for path in tmp_path.iterdir()] == ["out.bin"]
