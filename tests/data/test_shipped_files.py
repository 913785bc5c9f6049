"""The corpus files in recipes/data are intact, listed, attributed and small."""

import hashlib

from kzoo.data import corpus_dir


def shipped_files():
    return {
        str(path.relative_to(corpus_dir())): path
        for path in corpus_dir().rglob("*")
        if path.is_file() and path.name not in ("README.md", "SHA256SUMS")
    }


def test_sha256sums_cover_and_match_every_shipped_file():
    listed = {}
    for line in (corpus_dir() / "SHA256SUMS").read_text(encoding="utf-8").splitlines():
        digest, name = line.split(maxsplit=1)
        listed[name] = digest
    files = shipped_files()
    assert sorted(listed) == sorted(files)
    for name, path in files.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == listed[name], name


def test_every_corpus_folder_has_its_attribution():
    folders = sorted(path for path in corpus_dir().iterdir() if path.is_dir())
    assert [folder.name for folder in folders] == [
        "rt-polarity", "scitldr-a", "sentiment-labelled-sentences", "spa-eng",
        "tinyshakespeare", "ud-english-ewt", "wnut17",
    ]  # fmt: skip
    for folder in folders:
        readme = (folder / "README.md").read_text(encoding="utf-8")
        assert "**Source:**" in readme and "commit" in readme and "**License:**" in readme, folder.name


def test_shipped_data_stays_small():
    assert sum(path.stat().st_size for path in corpus_dir().rglob("*") if path.is_file()) < 10_000_000
