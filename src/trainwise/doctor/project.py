"""What a checked file's project declares about the torch it runs on (TW301: ``torch.load`` defaults to
``weights_only=True`` from torch 2.6).

The project root is the nearest folder at or above the file that holds a ``pyproject.toml``, ``setup.cfg``,
``setup.py`` or ``requirements*.txt`` (the walk stops at a folder holding ``.git``, at ``site-packages``, and
at the filesystem root). Its torch requirements are read from ``pyproject.toml`` (``[project]`` ``dependencies`` and
``optional-dependencies``), ``setup.cfg`` (``[options]`` ``install_requires`` and ``[options.extras_require]``)
and every ``requirements*.txt`` of the root. ``setup.py`` marks a root but is never read, let alone run.

The requirement strings are read by a small parser of this module, not by ``packaging``: ``packaging`` is no
dependency of trainwise, and a finding must not appear or vanish with what else is installed; the doctor needs
only a requirement's name and the lower bound of its version range. Anything it cannot read (a file that is
not UTF-8, invalid TOML, a FIFO, a file over 1 MiB, a requirement it does not understand) counts as not
declared, so that it never silences a finding; nothing here raises.
"""

from __future__ import annotations

import configparser
import os
import re
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

_MAX_BYTES = 1 << 20  # a declaration file larger than this is not read
_ROOT_FILES = ("pyproject.toml", "setup.cfg", "setup.py")
_INSTALLED = ("site-packages", "dist-packages")
_NAME = re.compile(r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(?:\[[^\]]*\])?\s*")
_SPECIFIER = re.compile(r"\s*(~=|===|==|!=|<=|>=|<|>)\s*([^\s,;()]+)\s*")
_RELEASE = re.compile(r"v?(?:(\d+)!)?(\d+(?:\.\d+)*)(?:\.\*)?(?:[._-]?[A-Za-z][\w.+-]*|\+[\w.]*)?")
_LOWER_BOUND_OPERATORS = frozenset({"~=", "===", "==", ">=", ">"})


@dataclass(frozen=True)
class TorchRequirement:
    """One declaration of torch: its text as written, the file it is in, whether it states a version range,
    and the lower bound of that range as ``(epoch, *release)`` with trailing zeros removed (pre-releases count
    as their release: ``2.6.0rc1`` is 2.6); ``lower`` is None when the range has no lower bound."""

    text: str
    source: str
    lower: tuple[int, ...] | None
    versioned: bool = True

    def admits_below(self, version: tuple[int, ...]) -> bool:
        """Whether this range admits a torch older than ``version`` (``(0, 2, 6)`` for 2.6)."""
        return self.lower is None or self.lower < _trim(version)


def torch_requirements(path: str) -> tuple[Path, tuple[TorchRequirement, ...]] | None:
    """The project root of the file at ``path`` and the torch requirements it declares (possibly none);
    None when the file is not on disk (a string checked as ``<string>``) or no project root is found."""
    try:
        file = Path(os.path.abspath(path))
        if not file.is_file():
            return None
    except (OSError, ValueError):  # a name with a NUL byte, too long for the system
        return None
    root = _project_root(file.parent)
    if root is None:
        return None
    return root, _declared(root)


def _project_root(start: Path) -> Path | None:
    """The nearest folder at or above ``start`` holding a declaration file (or ``setup.py``); None past ``.git``
    or ``site-packages``."""
    for folder in (start, *start.parents):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        if any(name in _ROOT_FILES or _is_requirements_file(name) for name in names):
            return folder
        if ".git" in names or folder.name in _INSTALLED:  # an installed package is not the project around it
            return None
    return None


def _is_requirements_file(name: str) -> bool:
    return name.startswith("requirements") and name.endswith(".txt")


# Per root: the (name, mtime, size) of its declaration files when read, and what they declared.
_CACHE: dict[str, tuple[tuple[tuple[str, int, int], ...], tuple[TorchRequirement, ...]]] = {}


def _declared(root: Path) -> tuple[TorchRequirement, ...]:
    """The torch requirements of a root's declaration files, read again only when one of them changed."""
    try:
        names = sorted(n for n in os.listdir(root) if n in ("pyproject.toml", "setup.cfg") or _is_requirements_file(n))
    except OSError:
        return ()
    signature = []
    for name in names:
        try:
            info = os.stat(root / name)
        except OSError:
            continue
        signature.append((name, info.st_mtime_ns, info.st_size))
    key = str(root)
    cached = _CACHE.get(key)
    if cached is not None and cached[0] == tuple(signature):
        return cached[1]
    found: list[TorchRequirement] = []
    for name, _, _ in signature:
        text = _read_text(root / name)
        if text is None:
            continue
        if name == "pyproject.toml":
            lines = _pyproject_requirements(text)
        elif name == "setup.cfg":
            lines = _setup_cfg_requirements(text)
        else:
            lines = _requirements_txt(text)
        found.extend(r for r in (parse_torch_requirement(line, name) for line in lines) if r is not None)
    result = tuple(found)
    _CACHE[key] = (tuple(signature), result)
    return result


def _read_text(path: Path) -> str | None:
    """The UTF-8 text of a regular file of at most 1 MiB, else None (a FIFO is never opened for reading)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            data = fh.read(_MAX_BYTES + 1)
        if len(data) > _MAX_BYTES:
            return None
        return data.decode("utf-8-sig")
    except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
        return None


def _pyproject_requirements(text: str) -> list[str]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        document = tomllib.loads(text)
    except (ValueError, RecursionError, MemoryError):  # TOMLDecodeError is a ValueError
        return []
    project = document.get("project")
    if not isinstance(project, dict):
        return []
    lists = [project.get("dependencies")]
    optional = project.get("optional-dependencies")
    if isinstance(optional, dict):
        lists.extend(optional.values())
    return [item for values in lists if isinstance(values, list) for item in values if isinstance(item, str)]


def _setup_cfg_requirements(text: str) -> list[str]:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read_string(text)
        values = [parser.get("options", "install_requires", fallback="")]
        if parser.has_section("options.extras_require"):
            values.extend(value for _, value in parser.items("options.extras_require"))
    except (configparser.Error, ValueError, KeyError, RecursionError, MemoryError):
        return []
    out = []
    for value in values:  # a dangling list, one per line, or one line of requirements separated by ";"
        items = value.splitlines() if "\n" in value.strip() else value.split(";")
        out.extend(item.strip() for item in items if item.strip() and not item.strip().startswith("#"))
    return out


def _requirements_txt(text: str) -> list[str]:
    out = []
    for line in re.sub(r"\\\r?\n", " ", text).splitlines():  # a backslash at the end continues the line
        line = re.sub(r"(?:^|\s)#.*", "", line).strip()
        if line and not line.startswith("-"):  # -r, -c, -e, --index-url ...: not a requirement of its own
            out.append(line)
    return out


def parse_torch_requirement(line: str, source: str = "") -> TorchRequirement | None:
    """The torch requirement a PEP 508 requirement string states (``torch>=2.6``, ``torch (==2.7.1)``,
    ``torch~=2.6; python_version >= "3.10"``), or None when it names another distribution or cannot be read."""
    match = _NAME.match(line)
    if match is None or re.sub(r"[-_.]+", "-", match.group(1)).lower() != "torch":
        return None
    text = " ".join(line.split())[:80]
    rest = line[match.end():].split(";", 1)[0].strip()
    if rest.startswith("@"):  # torch @ https://...: a file whose version is not declared here
        return TorchRequirement(text, source, None, versioned=False)
    if rest.startswith("(") and rest.endswith(")"):
        rest = rest[1:-1]
    if not rest.strip():
        return TorchRequirement(text, source, None, versioned=False)
    bounds: list[tuple[int, ...]] = []
    for part in rest.split(","):
        spec = _SPECIFIER.fullmatch(part)
        if spec is None:
            return None
        version = _release(spec.group(2))
        if version is None:
            return None
        if spec.group(1) in _LOWER_BOUND_OPERATORS:
            bounds.append(version)
    return TorchRequirement(text, source, max(bounds) if bounds else None)


def _release(version: str) -> tuple[int, ...] | None:
    """``(epoch, *release)`` of a version (``2.7.1+cpu`` -> ``(0, 2, 7, 1)``), trailing zeros removed."""
    match = _RELEASE.fullmatch(version) if len(version) <= 64 else None
    if match is None:
        return None
    return _trim((int(match.group(1) or 0), *(int(p) for p in match.group(2).split("."))))


def _trim(version: tuple[int, ...]) -> tuple[int, ...]:
    end = len(version)
    while end > 1 and version[end - 1] == 0:
        end -= 1
    return version[:end]
