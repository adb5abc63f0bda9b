"""Loading a script of ``benchmarks/`` in a test (the scripts are not a package): one helper for every test here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_benchmark(name: str, module_name: str | None = None, *, register: bool = True) -> ModuleType:
    """``benchmarks/<name>.py`` as a module, with ``benchmarks/`` importable while it runs (the scripts import
    each other). ``register``: kept in ``sys.modules`` under ``module_name`` (a dataclass in the script looks its
    module up there), and loaded once; otherwise a fresh module each call."""
    module_name = module_name or name
    if register and module_name in sys.modules:
        return sys.modules[module_name]
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(module_name, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        if register:
            sys.modules[module_name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))
