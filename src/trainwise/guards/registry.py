"""Every runtime check, by code: one module per code in this package."""

from __future__ import annotations

import functools
import importlib
import pkgutil

from trainwise.errors import TrainwiseError
from trainwise.guards.check import Check


def all_check_classes() -> list[type[Check]]:
    """The check classes of the ``twNNN_*.py`` modules of this package, in code order."""
    return list(_discovered())


@functools.cache
def _discovered() -> tuple[type[Check], ...]:
    """The package's check modules, listed and imported once per process (every fit asks)."""
    package = importlib.import_module("trainwise.guards")
    found = []
    for info in pkgutil.iter_modules(package.__path__):
        if not info.name.startswith("tw"):
            continue
        module = importlib.import_module(f"trainwise.guards.{info.name}")
        for value in vars(module).values():
            is_check = isinstance(value, type) and issubclass(value, Check) and value is not Check
            if is_check and value.code and value.__module__ == module.__name__:
                found.append(value)
    return tuple(sorted(found, key=lambda cls: cls.code))


def check_classes(codes: list[str] | None = None) -> list[type[Check]]:
    """The classes for ``codes`` (every check when None); an unknown code is one sentence."""
    classes = all_check_classes()
    if codes is None:
        return classes
    known = {cls.code: cls for cls in classes}
    unknown = [code for code in codes if code not in known]
    if unknown:
        raise TrainwiseError(f"no runtime guard has code {unknown[0]!r}; the codes are {', '.join(known)}.")
    return [known[code] for code in codes]
