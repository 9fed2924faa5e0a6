"""Rule code, one rule a module, registered by code (or by a rule file's `engine` for
table-driven rules). Every module of this package is imported once, so a new rule module
registers without an edit here."""

import importlib
import pkgutil


def import_all(package: str, path) -> list[str]:
    """Import every module of `package` (found on `path`), subpackages included: what they
    define registers itself. The modules' names, in import order."""
    names = [m.name for m in pkgutil.walk_packages(path, prefix=f"{package}.")]
    for name in names:
        importlib.import_module(name)
    return names


def load_transforms() -> list[str]:
    return import_all(__name__, __path__)
