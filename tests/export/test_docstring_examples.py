"""The examples in `kzoo.export.export`'s and `kzoo.files`' docstrings run and print what they show."""

import doctest
import inspect

import pytest

import kzoo
from kzoo import files
from kzoo.export import exporter


@pytest.mark.parametrize("documented", [exporter.export, files], ids=["export", "files"])
def test_docstring_example(documented, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    module = inspect.getmodule(documented)
    (test,) = doctest.DocTestFinder(recurse=False).find(documented, globs={**vars(module), "kzoo": kzoo})
    result = doctest.DocTestRunner().run(test)
    assert result.attempted and not result.failed
