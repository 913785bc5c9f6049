"""Files and folders written all or nothing: into a staging folder beside the destination, moved in when complete.

`atomic_folder(path)` yields a new, private staging folder in `path`'s parent (the same
filesystem, so that the move is one `rename`). When the block ends, and only then, the staging
folder becomes `path`; if the block raises, it is removed and nothing is left. Just before the
move, under a lock on the parent folder, the destination is checked again, so that of two
writers to one new folder only one succeeds; the other is told the folder was written
meanwhile. A full disk gives "No space left on device: nothing was written to <path>." (a
read-only one "Read-only file system: ..."), naming the user's path, never a staging name.

`atomic_file(path)` does the same for one file: it yields the open staging file (or, with
`mode=None`, its path, for libraries that write by name, such as `model.save` or gguf's
`GGUFWriter`), which is flushed to the disk (fsync) and renamed over `path` under the same lock.
The staging file lies in a staging folder of its own and has `path`'s name, so that libraries
that read the format from the file's extension (Keras, matplotlib) write the right one.
`write_text(path, text)` and `write_json(path, value)` write a whole file through it.

The temporary folders carry the host and process id of their writer
(`.<name>.<host>-<pid>.<random>.partial`, and `.<name>.<host>-<pid>.replaced` for the folder being
replaced), so that the next writer to the same path removes those of a process that was killed.

kzoo's exporter (`kzoo.export.export`) and Hugging Face checkpoint writer
(`kzoo.checkpoints.hf.save.save`) write their folders through it; the GGUF writer, the
checkpoints and backups of `kzoo.training` and the recipes' files go through `atomic_file`.

Example:
>>> with atomic_folder("example_folder", overwrite=True) as staging:
...     (staging / "weights.txt").write_text("1 2 3")
5
>>> sorted(path.name for path in Path("example_folder").iterdir())
['weights.txt']
>>> with atomic_file("example.txt", "w") as file:
...     file.write("all or nothing")
14
>>> Path("example.txt").read_text()
'all or nothing'
"""

import contextlib
import errno
import fcntl
import glob
import json
import os
import shutil
import socket
import tempfile
from pathlib import Path


class WriteError(OSError):
    """A file or folder that cannot be written; nothing was written to it."""


class FolderError(WriteError):
    """A folder that cannot be written; nothing was written to it."""


class FolderExistsError(FolderError, FileExistsError):
    """The destination holds files and replacing them was not asked for."""


class FileError(WriteError):
    """A file that cannot be written; nothing was written to it."""


class ExistingFileError(FileError, FileExistsError):
    """The file exists and replacing it was not asked for."""


# The errors of a disk that takes no more writes: reported as "<reason>: nothing was written to <path>."
_REFUSED_WRITES = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
# Also reported so when a write to the staging file or folder meets them (not a file the block reads).
_DENIED_WRITES = (errno.EACCES, errno.EPERM)


@contextlib.contextmanager
def atomic_folder(path, overwrite=False, hint="choose another folder"):
    """Yields a new staging folder (a Path) that becomes `path` when the block completes.

    A symbolic link at `path` is followed: the folder is written where the link points, and
    the link stays. Missing parent folders are created (and removed again on failure).

    Args:
        path: str or Path, the folder to write.
        overwrite: bool, replace a non-empty folder at `path`; it is moved aside and removed
            only once the new one is in place.
        hint: what the message tells the user to do about a non-empty folder.

    Raises:
        FolderError: before the block runs, when `path` or one of its parents is a file, `path`
            is a loop of symbolic links, or the parent cannot be written into; `FolderExistsError`
            when `path` is a non-empty folder, or another writer filled it while the block ran,
            and `overwrite` is off; and, for a full disk, "No space left on device: nothing was
            written to <path>." (for a read-only one, "Read-only file system: ..."). In every
            case nothing is left at `path` or beside it.
    """
    path = _resolved(path, FolderError)
    if path.exists() and not path.is_dir():
        raise FolderError(f"The output path {path} is a file, not a folder.")
    if not overwrite and _holds_files(path):
        raise FolderExistsError(f"{path} exists and is not an empty folder; {hint}.")
    with _staging_folder(path, FolderError) as staging:
        umask = os.umask(0)  # mkdtemp's folders are private (0o700): the result gets the usual mode
        os.umask(umask)
        staging.chmod(0o777 & ~umask)
        yield staging
        _move_into_place(staging, path, overwrite, hint)


@contextlib.contextmanager
def atomic_file(path, mode="wb", *, overwrite=True, encoding="utf-8"):
    """Yields a staging file that becomes `path`, whole, when the block completes.

    The staging file (`.<name>.<host>-<pid>.<random>.partial/<name>`, beside `path`) is private
    to this writer: of two writers to one path, the file ends up as one of them wrote it, never
    a mix. When the block ends it is flushed to the disk (fsync) and renamed over `path` under
    a lock on the parent folder; if the block raises, it is removed and `path` is as it was. A
    symbolic link at `path` is followed, and stays. Missing parent folders are created (and
    removed again on failure).

    Args:
        path: str or Path, the file to write.
        mode: "wb" (yields a binary file), "w" (a text file, in `encoding`), or None (yields
            the staging file's Path, for a library that writes the file by its name; it must
            have written it when the block ends).
        overwrite: bool, replace an existing file at `path`.
        encoding: the text encoding of mode "w".

    Raises:
        ValueError: for a `mode` other than "wb", "w" or None.
        FileError: when `path` is a folder or a loop of symbolic links, or one of its parents is
            a file, or the parent cannot be written into; "No space left on device: nothing
            was written to <path>." for a full disk, and "Read-only file system: ..." or
            "Permission denied: ..." for one that takes no writes; `ExistingFileError` when
            `path` exists (or another writer wrote it while the block ran) and `overwrite`
            is off. In every case nothing is left beside `path`, and `path` is as it was.
    """
    if mode not in ("wb", "w", None):
        raise ValueError(f"`mode` must be 'wb', 'w' or None (the staging path); received mode={mode!r}.")
    path = _resolved(path, FileError)
    if path.is_dir():
        raise FileError(f"{path} is a folder, not a file.")
    if not overwrite and path.exists():
        raise ExistingFileError(f"{path} exists; pass overwrite=True to replace it.")
    with _staging_folder(path, FileError) as folder:
        staging = folder / path.name
        if mode is None:
            yield staging
            if not staging.is_file():
                raise FileError(f"Nothing was written to {path}: the writer made no file.")
            _fsync(staging)
        else:
            with open(staging, mode, encoding=None if "b" in mode else encoding) as file:
                yield file
                file.flush()
                os.fsync(file.fileno())
        with _locked(path.parent):
            if not overwrite and os.path.lexists(path):
                raise ExistingFileError(f"{path} was written by another writer while this one ran.")
            os.replace(staging, path)
        with contextlib.suppress(OSError):  # the rename itself lasts once the folder is on the disk
            _fsync(path.parent)


def write_text(path, text, overwrite=True):
    """Writes `text` (UTF-8) to the file `path`, all or nothing (see `atomic_file`)."""
    with atomic_file(path, "w", overwrite=overwrite) as file:
        file.write(text)


def write_json(path, value, overwrite=True):
    """Writes `value` as indented JSON to the file `path`, all or nothing (see `atomic_file`)."""
    write_text(path, json.dumps(value, indent=2) + "\n", overwrite=overwrite)


def remove_stale_staging(path):
    """Removes the temporary folders of killed writers to `path`: a `.partial` staging folder,
    or the earlier folder it was replacing (`.replaced`, put back if nothing replaced it).
    Those of a process of this host that is still running, or of another host, are kept."""
    path = Path(path)
    prefix = f".{path.name}."
    for folder in path.parent.glob(f"{glob.escape(prefix)}*"):
        if folder.suffix not in (".partial", ".replaced") or not folder.is_dir():
            continue
        # ".<name>.<host>-<pid>.<random>.partial" or ".<name>.<host>-<pid>.replaced"
        middle = folder.name[len(prefix) : -len(folder.suffix)]
        owner = middle.rpartition(".")[0] if folder.suffix == ".partial" else middle
        host, _, pid = owner.rpartition("-")
        if host not in (socket.gethostname(), "") or (pid.isdigit() and _running(int(pid))):
            continue
        if folder.suffix == ".replaced" and not path.exists():
            folder.rename(path)
        else:
            shutil.rmtree(folder, ignore_errors=True)


def _resolved(path, error_type):
    """`path` absolute, its links followed; a loop of links is an `error_type` naming `path`."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError) as error:  # RuntimeError until Python 3.13, then OSError(ELOOP)
        raise error_type(f"Cannot write {path}: it is a loop of symbolic links, which leads to no file.") from error


@contextlib.contextmanager
def _staging_folder(path, error_type):
    """Yields a new, private folder beside `path` (in its parent, created if missing) for its writer.

    On leaving it is removed; on failure so are the parents it created, and a disk that takes
    no more writes, met in making the folder or by a write into it, is an `error_type` naming
    `path` ("No space left on device: nothing was written to <path>.").
    """
    created = [folder for folder in path.parents if not folder.exists()]
    try:  # the staging folder is the test of the parent's permissions (os.access ignores read-only mounts)
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_staging(path)
        staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.{_owner()}.", suffix=".partial", dir=path.parent))
    except (FileExistsError, NotADirectoryError) as error:
        _remove_folders(created)
        raise error_type(f"Cannot create {path}: its parent {error.filename} is not a folder.") from error
    except OSError as error:
        _remove_folders(created)
        if error.errno in _REFUSED_WRITES:
            raise error_type(f"{_reason(error)}: nothing was written to {path}.") from error
        raise error_type(f"Cannot write into {path.parent}: {error.strerror}.") from error
    try:
        yield staging
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        _remove_folders(created)
        if _refused(error, staging):
            raise error_type(f"{_reason(error)}: nothing was written to {path}.") from error
        raise
    shutil.rmtree(staging, ignore_errors=True)  # a file's, emptied by its rename; a folder's is renamed


def _remove_folders(folders):
    for folder in folders:  # innermost first
        with contextlib.suppress(OSError):
            folder.rmdir()


def _refused(error, staging):
    """Whether `error` is a disk that takes no more writes: full (anywhere: libraries that write
    files themselves, as TensorFlow, raise their own types), or read-only or denied while
    writing into `staging` (not a file the block reads)."""
    if disk_full(error):
        return True
    if not isinstance(error, OSError) or error.errno not in _REFUSED_WRITES + _DENIED_WRITES:
        return False
    names = [name for name in (error.filename, error.filename2) if name is not None]
    return not names or any(Path(os.fsdecode(name)).is_relative_to(staging) for name in names)


def _reason(error):
    return os.strerror(errno.ENOSPC) if disk_full(error) else os.strerror(error.errno)


def _fsync(path):
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _move_into_place(staging, path, overwrite, hint):
    """Renames the finished `staging` to `path` (same filesystem: atomic), after checking again,
    under a lock on the parent folder, that `path` is still free or may be replaced."""
    with _locked(path.parent):
        if _holds_files(path):
            if not overwrite:
                raise FolderExistsError(f"{path} was filled by another writer while this one ran; {hint}.")
            retired = path.with_name(f".{path.name}.{_owner()}.replaced")
            path.rename(retired)
            staging.rename(path)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            staging.rename(path)  # replaces an empty folder


@contextlib.contextmanager
def _locked(folder):
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # releases the lock


def _holds_files(path):
    return path.is_dir() and any(path.iterdir())


def _owner():
    """This process, as its temporary folders name it: "<host>-<pid>"."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def disk_full(error):
    """Whether `error` says the disk (or the user's quota) is full. Libraries that write files
    themselves (TensorFlow, h5py) raise their own types, with the system's message."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return isinstance(error, Exception) and os.strerror(errno.ENOSPC) in str(error)
