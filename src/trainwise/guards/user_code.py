"""Which source files are the user's own code: where ``trainwise run`` places a finding (its innermost frame).

Not the user's: torch, trainwise, the standard library (frozen modules as ``<frozen runpy>`` too) and any
installed package (a folder named ``site-packages`` or ``dist-packages``, wherever it lies, and the interpreter's
library folders). Code compiled from a string (``<string>``, a notebook's cell) is the user's. A step that runs
inside a library's wrapper (Accelerate's ``AcceleratedOptimizer.step``) is so placed at the user's line calling it.
"""

from __future__ import annotations

import os
import site
import sysconfig
from collections.abc import Iterable

import torch

_INSTALLED = frozenset({"site-packages", "dist-packages"})


def _folder(path: str) -> str:
    return os.path.join(os.path.abspath(path), "")


def library_folders() -> tuple[str, ...]:
    """The folders whose files are never the user's: torch's, trainwise's, and the interpreter's library folders
    (standard library and installed packages), each as given and with its links resolved."""
    found = [os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)),
             os.path.dirname(os.__file__)]
    paths = sysconfig.get_paths()
    found += [paths[name] for name in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(name)]
    found += list(getattr(site, "getsitepackages", list)())
    if site.ENABLE_USER_SITE and site.USER_SITE:
        found.append(site.USER_SITE)
    folders = {_folder(p) for p in found} | {_folder(os.path.realpath(p)) for p in found}
    return tuple(sorted(folders))


class UserCode:
    """Tells whether a code object's file name is the user's code; ``own`` names files or folders that are the
    user's wherever they lie (the script or package run, which may itself be installed). Answers are cached."""

    def __init__(self, own: Iterable[str] = ()) -> None:
        self.own = tuple(os.path.abspath(p) for p in own)
        self.libraries = library_folders()
        self._known: dict[str, bool] = {}

    def __call__(self, filename: str) -> bool:
        known = self._known.get(filename)
        if known is None:
            known = self._known[filename] = self._decide(filename)
        return known

    def _decide(self, filename: str) -> bool:
        if filename.startswith("<frozen"):  # the interpreter's frozen modules (runpy)
            return False
        path = os.path.abspath(filename)
        if any(path == p or path.startswith(os.path.join(p, "")) for p in self.own):
            return True
        if _INSTALLED.intersection(path.split(os.sep)):
            return False
        return not path.startswith(self.libraries) and not os.path.realpath(path).startswith(self.libraries)
