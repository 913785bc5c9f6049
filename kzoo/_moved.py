"""Old import paths of modules that moved: each leaves a short file at its old path.

An old module keeps answering every public name it had, from its new home, with a
`DeprecationWarning` naming where the name lives now. kzoo's own code imports only the new
paths (tests/test_layout.py checks), so the warning reaches only users' code.
"""

import importlib
import warnings


def moved(old, *new):
    """A module `__getattr__` for the module `old` that finds each name in the modules `new`, in order."""

    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        for module_name in new:
            module = importlib.import_module(module_name)
            if hasattr(module, name):
                warnings.warn(
                    f"{old}.{name} moved to {module_name}.{name}; import it from there.",
                    DeprecationWarning,
                    stacklevel=2,
                )
                return getattr(module, name)
        raise AttributeError(f"module {old!r} has no attribute {name!r} (it moved to {', '.join(new)})")

    return __getattr__
