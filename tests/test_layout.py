"""The house by concern: imports point down the layers, and old module paths keep working.

The layers, top to bottom (a module may import its own package and those below it):
export, training -> models -> data, checkpoints -> tokenizers -> layers -> ops, samplers ->
files, config, logs, validation, _compat. `kzoo/__init__.py` and the old paths of moved
modules (`kzoo._moved.MOVED`) are outside the order.
"""

import ast
import importlib
import warnings
from pathlib import Path

import pytest

from kzoo import _moved

REPOSITORY = Path(__file__).resolve().parents[1]

# Each package, and the kzoo packages it must never import (at any depth, even inside a function).
ABOVE = {
    "kzoo.tokenizers": ("kzoo.checkpoints", "kzoo.data", "kzoo.models", "kzoo.training", "kzoo.export"),
    "kzoo.checkpoints": ("kzoo.data", "kzoo.models", "kzoo.training", "kzoo.export"),
    "kzoo.data": ("kzoo.checkpoints", "kzoo.models", "kzoo.training", "kzoo.export"),
    "kzoo.layers": ("kzoo.tokenizers", "kzoo.checkpoints", "kzoo.data", "kzoo.models", "kzoo.training", "kzoo.export"),
    "kzoo.models": ("kzoo.training", "kzoo.export"),
}

# Packages whose modules are still moving (issue 40): expected to fail until then, and to pass after.
PENDING = set()


def module_name(path):
    parts = path.relative_to(REPOSITORY).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path):
    """Every module `path` imports, at any depth, with `from x import y` also as `x.y`."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def sources(*folders):
    for folder in folders:
        for path in sorted((REPOSITORY / folder).rglob("*.py")):
            if module_name(path) not in _moved.MOVED:
                yield path


@pytest.mark.parametrize(
    "package", [pytest.param(p, marks=pytest.mark.xfail(strict=True)) if p in PENDING else p for p in sorted(ABOVE)]
)
def test_imports_point_down(package):
    wrong = []
    for path in sources(package.replace(".", "/")):
        for name in sorted(imported(path)):
            if any(name == above or name.startswith(above + ".") for above in ABOVE[package]):
                wrong.append(f"{path.relative_to(REPOSITORY)} imports {name}")
    assert wrong == []


def test_nothing_imports_an_old_path():
    old = set(_moved.MOVED)
    wrong = []
    for path in sources("kzoo", "recipes", "export", "benchmarks", "tests"):
        if path.name != "test_layout.py":
            wrong += [f"{path.relative_to(REPOSITORY)} imports {name}" for name in sorted(imported(path) & old)]
    assert wrong == []


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_old_paths_answer_from_the_new_home(old):
    module = importlib.import_module(old)
    for new in _moved.MOVED[old]:
        home = importlib.import_module(new)
        public = [name for name in vars(home) if not name.startswith("_")]
        assert public
        for name in public:
            # A name two homes share is answered by the first, as `from old import name` did.
            first = next(m for m in _moved.MOVED[old] if hasattr(importlib.import_module(m), name))
            with pytest.warns(DeprecationWarning, match=rf"{old}\.{name} moved to {first}\.{name};"):
                value = getattr(module, name)
            assert value is getattr(importlib.import_module(first), name)
    with pytest.raises(AttributeError, match="moved to"):
        module.no_such_name
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert module.__name__ == old  # no warning for the module's own attributes
