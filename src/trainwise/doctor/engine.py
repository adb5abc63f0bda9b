"""The doctor's engine: find files, read and decode each, and check its text (``analysis.py``: parse with
``ast``, run every selected rule in one pass, apply noqa; ``notebook.py`` for a notebook's cells).

Nothing here imports torch (or numpy): the doctor reads training scripts, it never runs them. A file that
cannot be read or parsed becomes one ``TW900`` finding and the run goes on.
"""

from __future__ import annotations

import errno
import gc
import os
import re
import stat
import sys
import tokenize
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trainwise.doctor.analysis import PARSE_ERROR, analyse, parse_error
from trainwise.doctor.gitignore import IgnoreSet, ignored, parse_gitignore
from trainwise.doctor.notebook import cell_sources, check_notebook, join_cells
from trainwise.doctor.program import Program, SourceText
from trainwise.doctor.rule import Finding, Rule
from trainwise.errors import TrainwiseError

SKIP_DIRS = frozenset({".venv", "venv", ".git", "build", "site-packages", "__pycache__", ".tox", ".nox",
                       ".mypy_cache", ".ruff_cache", ".pytest_cache", ".ipynb_checkpoints", "node_modules"})
SUFFIXES = (".py", ".ipynb")
CONFIG_KEYS = frozenset({"select", "ignore", "exclude", "unsafe-fixes"})


# ------------------------------------------------------------------------------------------------ configuration
@dataclass(frozen=True)
class Config:
    """Which rules run, which paths are left out, and whether unsafe fixes apply."""

    select: tuple[str, ...] = ()  # codes or prefixes; empty means every rule enabled by default
    ignore: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()  # gitignore-style patterns, relative to the current directory
    unsafe_fixes: bool = False

    def enabled(self, code: str, *, default: bool = True) -> bool:
        """Whether a code is selected (by code, by prefix such as ``TW1``, or by ``ALL``) and not ignored."""
        if code == PARSE_ERROR:
            return not any(code_matches(code, p) for p in self.ignore)
        selected = any(code_matches(code, p) for p in self.select) if self.select else default
        return selected and not any(code_matches(code, p) for p in self.ignore)

    def rules(self) -> list[type[Rule]]:
        """The rule classes this configuration runs."""
        from trainwise.doctor.rules import all_rules

        return [r for r in all_rules() if r.code != PARSE_ERROR and self.enabled(r.code, default=r.default_enabled)]


def code_matches(code: str, pattern: str) -> bool:
    """Whether a selection pattern (a code, a prefix such as ``TW1``, or ``ALL``) takes ``code``."""
    return pattern == "ALL" or code.startswith(pattern)





def parse_codes(values: Iterable[str] | None, *, option: str, guards: Sequence[str] = (),
                also: Sequence[str] = ()) -> tuple[str, ...]:
    """Split comma-separated codes and prefixes (``ALL``, and ``also``'s words); raise ``TrainwiseError`` for
    one that matches no rule (nor, when given, one of the run-time ``guards``' codes)."""
    from trainwise.doctor.rules import all_rules

    codes = sorted({r.code for r in all_rules()} | set(guards))
    out = []
    for value in values or ():
        for part in str(value).split(","):
            part = part.strip().upper()
            if not part:
                continue
            if part not in ("ALL", *also) and not any(c.startswith(part) for c in codes):
                if guards:
                    raise TrainwiseError(f"{option}: {part!r} matches no rule or guard; the codes are "
                                         f"{', '.join(codes)}.")
                raise TrainwiseError(f"{option}: {part!r} matches no rule; see `trainwise doctor --explain TW101` "
                                     f"or docs/rules/ for the codes ({', '.join(codes)}).")
            out.append(part)
    return tuple(out)


def _tomllib():  # type: ignore[no-untyped-def]
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    return tomllib


_OUR_TABLE = re.compile(rb"tool\s*\.\s*[\"']?trainwise")


def _toml_type(value: object) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array",
             dict: "a table"}
    return next((name for kind, name in names.items() if isinstance(value, kind)), "a date or time")


def _find_doctor_table(start: Path) -> tuple[Path, dict] | None:
    """The nearest ``pyproject.toml`` with a ``[tool.trainwise.doctor]`` table, and that table.

    Files without the table are passed over (so are unreadable ones, and invalid TOML that never mentions
    ``tool.trainwise``); invalid TOML that does, or ``tool``, ``tool.trainwise`` or ``tool.trainwise.doctor``
    that is not a table, is a ``TrainwiseError`` naming the key, as ruff does for its own table."""
    tomllib = None
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        try:
            if not candidate.is_file():
                continue
            data = candidate.read_bytes()
        except OSError:
            continue
        if b"trainwise" not in data:
            continue
        tomllib = tomllib or _tomllib()
        try:
            document = tomllib.loads(data.decode("utf-8"))
        except (ValueError, RecursionError, MemoryError) as exc:  # TOMLDecodeError, UnicodeDecodeError: ValueError
            if _OUR_TABLE.search(data) is None:
                continue
            reason = "not UTF-8" if isinstance(exc, UnicodeDecodeError) else (
                "nested too deeply" if not isinstance(exc, ValueError) else str(exc).splitlines()[0])
            raise TrainwiseError(f"{candidate} is not valid TOML ({reason}), so its [tool.trainwise.doctor] "
                                 "settings cannot be read; fix the file.") from None
        table: object = document
        for depth, key in enumerate(("tool", "trainwise", "doctor")):
            value = table.get(key) if isinstance(table, dict) else None
            if value is None:
                break
            if not isinstance(value, dict):
                dotted = ".".join(("tool", "trainwise", "doctor")[: depth + 1])
                raise TrainwiseError(f"{candidate}: {dotted} is {_toml_type(value)} but must be a table; put the "
                                     "doctor's settings under a [tool.trainwise.doctor] header (see docs/doctor.md).")
            table = value
        else:
            return candidate, table  # type: ignore[return-value]
    return None


def load_config(start: Path | None = None) -> Config:
    """Settings of ``[tool.trainwise.doctor]`` (keys ``select``, ``ignore``, ``exclude``, ``unsafe-fixes``)."""
    found = _find_doctor_table(Path.cwd() if start is None else start)
    if found is None:
        return Config()
    path, table = found
    unknown = sorted(set(table) - CONFIG_KEYS)
    if unknown:
        raise TrainwiseError(f"{path}: unknown key {unknown[0]!r} in [tool.trainwise.doctor]; "
                             f"known keys: {', '.join(sorted(CONFIG_KEYS))}.")
    for key in ("select", "ignore", "exclude"):
        if key in table and not (isinstance(table[key], list) and all(isinstance(v, str) for v in table[key])):
            raise TrainwiseError(f"{path}: [tool.trainwise.doctor] {key} must be a list of strings.")
    if not isinstance(table.get("unsafe-fixes", False), bool):
        raise TrainwiseError(f"{path}: [tool.trainwise.doctor] unsafe-fixes must be true or false.")
    return Config(
        select=parse_codes(table.get("select", ()), option=f"{path.name} select"),
        ignore=parse_codes(table.get("ignore", ()), option=f"{path.name} ignore"),
        exclude=tuple(table.get("exclude", ())),
        unsafe_fixes=table.get("unsafe-fixes", False),
    )


# ------------------------------------------------------------------------------------------------ checking
@dataclass
class FileResult:
    """The outcome for one file: its findings, and what ``--fix`` needs (source text and encoding)."""

    path: str
    findings: list[Finding] = field(default_factory=list)
    # Decoded text: None when unreadable, and, after a run of many files (check_paths), for a file that parsed
    # and has no finding with a fix, which --fix does not rewrite (transformers' texts took 125 MB).
    source: str | None = None
    encoding: str = "utf-8"
    parsed: bool = False  # False after a TW900: such a file is never modified
    notebook: bool = False


def check_source(source: str, path: str = "<string>", *, config: Config | None = None,
                 rules: Sequence[type[Rule]] | None = None) -> list[Finding]:
    """Check Python source text; return its findings (a ``TW900`` one if it does not parse), noqa applied."""
    findings, _ = analyse(source, path, rules=(config or Config()).rules() if rules is None else rules)
    return findings


def check_sources(sources: dict[str, str], *, config: Config | None = None,
                  rules: Sequence[type[Rule]] | None = None) -> dict[str, list[Finding]]:
    """Check Python source texts as the files of one run (``{"train.py": ..., "utils/fit.py": ...}``, paths
    relative to one folder), so that findings may cross them; each path's findings, noqa applied."""
    rules = (config or Config()).rules() if rules is None else rules
    program = Program(list(sources), lambda path: SourceText(sources[path]) if path in sources else None)
    return {path: analyse(source, path, rules=rules, program=program)[0] for path, source in sources.items()}


_BYTE_LINE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")


def decode(data: bytes) -> tuple[str, str]:
    """Text and encoding of Python source bytes (PEP 263 cookie or BOM, else UTF-8). Lines end at ``\\n``,
    ``\\r\\n`` or a lone ``\\r``, as for Python itself (a file of lone ``\\r`` may declare its encoding too)."""
    lines = (match.group() for match in _BYTE_LINE.finditer(data))
    encoding, _ = tokenize.detect_encoding(lambda: next(lines, b""))
    return data.decode(encoding), encoding


class _NotRegularFile(Exception):
    """A named pipe, device or socket: reading it could block forever or never end."""


def _file_kind(mode: int) -> str | None:
    """What a non-regular file is, in words (None for a regular file)."""
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "a special file")


def _not_regular(kind: str) -> str:
    return f"not a regular file but {kind}; skipped without reading it"


def _read_bytes(path: str) -> bytes:
    """The content of a regular file. Anything else is refused before it is opened (a named pipe would block
    the run, a device might never end); a file swapped for one in between is opened without blocking and
    refused too."""
    kind = _file_kind(os.stat(path).st_mode)
    if kind is not None:
        raise _NotRegularFile(_not_regular(kind))
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    with os.fdopen(fd, "rb") as fh:
        kind = _file_kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise _NotRegularFile(_not_regular(kind))
        return fh.read()


def check_file(path: str, config: Config | None = None, *, rules: Sequence[type[Rule]] | None = None,
               program: Program | None = None) -> FileResult:
    """Check one ``.py`` file or ``.ipynb`` notebook given by its display path; ``program``: the files of the
    run it belongs to (``check_paths``), for findings across files (alone when None)."""
    rules = (config or Config()).rules() if rules is None else rules
    result = FileResult(path, notebook=path.endswith(".ipynb"))
    try:
        data = _read_bytes(path)
    except OSError as exc:
        result.findings = [parse_error(path, f"cannot read: {_os_reason(exc)}")]
        return result
    except _NotRegularFile as exc:
        result.findings = [parse_error(path, str(exc))]
        return result
    if result.notebook:
        result.findings, result.parsed = check_notebook(data, path, rules=rules, program=program)
        return result
    try:
        result.source, result.encoding = decode(data)
    except (SyntaxError, UnicodeDecodeError, LookupError) as exc:
        reason = "not valid UTF-8 (nor the encoding it declares)" if isinstance(exc, UnicodeDecodeError) else (
            f"bad encoding declaration: {exc}")
        result.findings = [parse_error(path, f"cannot decode: {reason}")]
        return result
    result.findings, result.parsed = analyse(result.source, path, rules=rules, program=program)
    return result


def read_source(path: str) -> SourceText | None:
    """The text the program parses for a file of the run (a notebook's code cells joined), or None when it
    cannot be read or decoded: that file then answers no question of the others (its own check says why)."""
    try:
        data = _read_bytes(path)
        if path.endswith(".ipynb"):
            joined = join_cells(cell_sources(data))
            return SourceText(joined.source, joined)
        return SourceText(decode(data)[0])
    except (OSError, _NotRegularFile, SyntaxError, ValueError, LookupError):  # UnicodeDecodeError: ValueError
        return None


def check_paths(paths: Sequence[str], config: Config | None = None) -> list[FileResult]:
    """Check files and folders (recursively) as one program, so that a finding may cross files (a helper of
    ``utils.py`` called from ``train.py``); results sorted by path, unreadable paths as TW900 findings."""
    config = config or Config()
    files, errors = discover(paths, exclude=config.exclude)
    results = check_in_program(files, files, config)
    results.extend(FileResult(e.path, [e]) for e in errors)
    for result in results:
        result.findings = [f for f in result.findings if config.enabled(f.code)]
        result.findings.sort(key=Finding.sort_key)
    results.sort(key=lambda r: r.path)
    return results


def check_in_program(files: Sequence[str], program_files: Sequence[str], config: Config) -> list[FileResult]:
    """Check ``files`` as files of the run made of ``program_files`` (read from disk now), so that a finding
    may cross files; ``--fix`` re-checks the files it wrote this way, with the run's other files."""
    rules = config.rules()
    program = Program(program_files, read_source)
    results = []
    collecting = gc.isenabled()
    if collecting:
        # The run allocates millions of syntax nodes, and the cycle collector would scan the ones the program
        # keeps again and again (a run over transformers once took three times as long; freezing them after
        # each file still left a quarter of the time in collections while parsing). What the run builds is freed
        # by reference counting: the program breaks the one cycle of a context it drops (see program._release).
        gc.disable()
    try:
        for file in files:
            result = check_file(file, config, rules=rules, program=program)
            if result.parsed and not any(f.fix is not None for f in result.findings):
                result.source = None
            results.append(result)
    finally:
        program.close()
        if collecting:
            gc.enable()
    return results


# ------------------------------------------------------------------------------------------------ discovery
def _read_gitignore(folder: str) -> IgnoreSet | None:
    try:  # a .gitignore that is a named pipe or a device is never opened, as git does not read one either
        data = _read_bytes(os.path.join(folder, ".gitignore"))
    except (OSError, _NotRegularFile):
        return None
    text = data.decode("utf-8", errors="replace").removeprefix("\ufeff")  # git skips a UTF-8 BOM
    return IgnoreSet(folder, parse_gitignore(text.split("\n")))


def _ancestor_ignores(folder: str) -> list[IgnoreSet]:
    """``.gitignore`` files of the folders above ``folder`` up to the repository root (the one with ``.git``)."""
    chain = []
    current = os.path.abspath(folder)
    for _ in range(64):
        parent = os.path.dirname(current)
        if os.path.exists(os.path.join(current, ".git")) or parent == current:
            break
        current = parent
        chain.append(current)
    if not chain or not os.path.exists(os.path.join(chain[-1], ".git")):
        return []
    found = []
    for ancestor in reversed(chain):
        ignore_set = _read_gitignore(ancestor)
        if ignore_set is not None:
            found.append(ignore_set)
    return found


def discover(paths: Sequence[str], *, exclude: Sequence[str] = ()) -> tuple[list[str], list[Finding]]:
    """Python files and notebooks under ``paths`` (explicit files always count), skipping virtualenvs,
    ``.git``, ``build``, ``site-packages`` and what ``.gitignore`` ignores; unreadable folders and symlink
    loops become TW900 findings."""
    files: list[str] = []
    errors: list[Finding] = []
    extra = [IgnoreSet(os.getcwd(), parse_gitignore(exclude))] if exclude else []
    for raw in paths:
        path = os.path.normpath(raw)
        try:
            st = os.stat(path)
        except OSError as exc:
            errors.append(parse_error(path, f"cannot read: {_os_reason(exc)}"))
            continue
        if stat.S_ISDIR(st.st_mode):
            ignore_sets = extra + _ancestor_ignores(path)
            _walk(path, ignore_sets, {(st.st_dev, st.st_ino)}, set(), files, errors)
        elif stat.S_ISREG(st.st_mode):
            files.append(path)
        else:  # never opened: reading a named pipe blocks until something writes to it
            errors.append(parse_error(path, _not_regular(_file_kind(st.st_mode) or "a special file")))
    unique = sorted(dict.fromkeys(files))
    return unique, errors


def _walk(folder: str, ignore_sets: list[IgnoreSet], ancestors: set[tuple[int, int]], visited: set[tuple[int, int]],
          files: list[str], errors: list[Finding]) -> None:
    own = _read_gitignore(folder)
    if own is not None:
        ignore_sets = [*ignore_sets, own]
    try:
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as exc:
        errors.append(parse_error(folder, f"cannot read folder: {_os_reason(exc)}"))
        return
    for entry in entries:
        path = os.path.join(folder, entry.name) if folder != "." else entry.name
        try:
            st = os.stat(entry.path)  # follows symbolic links
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                errors.append(parse_error(path, "symbolic link loop, skipped"))
            elif entry.name.endswith(SUFFIXES) and not entry.is_symlink():
                errors.append(parse_error(path, f"cannot read: {_os_reason(exc)}"))
            continue
        if stat.S_ISDIR(st.st_mode):
            if entry.name in SKIP_DIRS or entry.name.endswith(".egg-info") or ignored(path, True, ignore_sets):
                continue
            key = (st.st_dev, st.st_ino)
            if key in ancestors:
                errors.append(parse_error(path, "symbolic link loop (links back to a folder above), skipped"))
                continue
            if key in visited:
                continue
            visited.add(key)
            _walk(path, ignore_sets, ancestors | {key}, visited, files, errors)
        elif stat.S_ISREG(st.st_mode) and entry.name.endswith(SUFFIXES) and not ignored(path, False, ignore_sets):
            files.append(path)


def _os_reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


__all__ = ["Config", "FileResult", "analyse", "check_file", "check_in_program", "check_paths", "check_source",
           "check_sources", "code_matches", "discover", "load_config", "parse_codes"]
