"""Folders written all or nothing: into a staging folder beside the destination, moved in when complete.

`atomic_folder(path)` yields a new, private staging folder in `path`'s parent (the same
filesystem, so that the move is one `rename`). When the block ends, and only then, the staging
folder becomes `path`; if the block raises, it is removed and nothing is left. Just before the
move, under a lock on the parent folder, the destination is checked again, so that of two
writers to one new folder only one succeeds; the other is told the folder was written
meanwhile. A full disk gives "No space left on device: nothing was written to <path>."

The temporary folders carry the host and process id of their writer
(`.<name>.<host>-<pid>.<random>.partial`, and `.<name>.<host>-<pid>.replaced` for the folder being
replaced), so that the next writer to the same path removes those of a process that was killed.

kzoo's exporter (`kzoo.export.export`) and Hugging Face checkpoint writer
(`kzoo.models.hf_checkpoint.save`) write their folders through it.

Example:
>>> with atomic_folder("example_folder", overwrite=True) as staging:
...     (staging / "weights.txt").write_text("1 2 3")
5
>>> sorted(path.name for path in Path("example_folder").iterdir())
['weights.txt']
"""

import contextlib
import errno
import fcntl
import glob
import os
import shutil
import socket
import tempfile
from pathlib import Path


class FolderError(OSError):
    """A folder that cannot be written; nothing was written to it."""


class FolderExistsError(FolderError, FileExistsError):
    """The destination holds files and replacing them was not asked for."""


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
        FolderError: before the block runs, when `path` or one of its parents is a file, or
            the parent cannot be written into; `FolderExistsError` when `path` is a non-empty folder,
            or another writer filled it while the block ran, and `overwrite` is off; and, for a
            full disk, "No space left on device: nothing was written to <path>." In every case
            nothing is left at `path` or beside it.
    """
    path = Path(path).resolve()
    if path.exists() and not path.is_dir():
        raise FolderError(f"The output path {path} is a file, not a folder.")
    if not overwrite and _holds_files(path):
        raise FolderExistsError(f"{path} exists and is not an empty folder; {hint}.")
    created = [folder for folder in path.parents if not folder.exists()]
    try:  # the staging folder is the test of the parent's permissions (os.access ignores read-only mounts)
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_staging(path)
        staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.{_owner()}.", suffix=".partial", dir=path.parent))
    except (FileExistsError, NotADirectoryError) as error:
        raise FolderError(f"Cannot create {path}: its parent {error.filename} is not a folder.") from error
    except OSError as error:
        raise FolderError(f"Cannot write into {path.parent}: {error.strerror}.") from error
    try:
        umask = os.umask(0)  # mkdtemp's folders are private (0o700): the result gets the usual mode
        os.umask(umask)
        staging.chmod(0o777 & ~umask)
        yield staging
        _move_into_place(staging, path, overwrite, hint)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        for folder in created:  # innermost first
            with contextlib.suppress(OSError):
                folder.rmdir()
        if _disk_full(error):
            raise FolderError(f"No space left on device: nothing was written to {path}.") from error
        raise


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


def _disk_full(error):
    """Whether `error` says the disk (or the user's quota) is full. Libraries that write files
    themselves (TensorFlow) raise their own types, with the system's message."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return isinstance(error, Exception) and os.strerror(errno.ENOSPC) in str(error)
