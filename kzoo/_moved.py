"""Old import paths of modules that moved: each leaves a short file at its old path.

`MOVED` maps each old module to its new homes. The old module answers every name of those
modules with a `DeprecationWarning` naming where it lives now. kzoo's own code, recipes,
scripts and tests import only the new paths (tests/test_layout.py checks), so the warning
reaches only users' code. Saved `.keras` files name classes by their registered names, not
by module, so moving a module never breaks them.
"""

import importlib
import warnings

MOVED = {
    "kzoo.models.decoder.families": ("kzoo.checkpoints.families",),
}


def moved(old):
    """The module `__getattr__` of the old module `old`: each name found in its new homes, in order."""
    new = MOVED[old]

    def __getattr__(name):
        if not name.startswith("__"):
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
