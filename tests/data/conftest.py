from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tfds_dir(tmp_path_factory):
    """A tensorflow-datasets data_dir for the whole session, so nothing is written to ~."""
    return tmp_path_factory.mktemp("tfds")


@pytest.fixture
def write_corpus(tmp_path):
    """Writes `{relative path: str or bytes}` under a temporary source dir and returns the dir."""

    def write(files):
        for name, content in files.items():
            path = Path(tmp_path, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
        return tmp_path

    return write
