"""The rule registry: every ``twNNN_<name>.py`` module here defines one ``Rule`` subclass, found by name.

Adding a rule means adding its file; nothing else registers it.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from trainwise.doctor.rule import Rule


@functools.cache
def all_rules() -> tuple[type[Rule], ...]:
    """Every rule class, sorted by code."""
    found: dict[str, type[Rule]] = {}
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("tw"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Rule) and value is not Rule and value.code:
                if value.__module__ != module.__name__:
                    continue
                if value.code in found and found[value.code] is not value:
                    raise RuntimeError(f"two rules claim {value.code}: {found[value.code]} and {value}")
                found[value.code] = value
    return tuple(found[code] for code in sorted(found))


def rule_for(code: str) -> type[Rule] | None:
    """The rule class with this code (case-insensitive), or None."""
    code = code.strip().upper()
    return next((r for r in all_rules() if r.code == code), None)
