"""The doctor's engine: find files, parse each with ``ast``, run every selected rule in one pass, apply noqa.

Nothing here imports torch (or numpy): the doctor reads training scripts, it never runs them. A file that
cannot be read or parsed becomes one ``TW900`` finding and the run goes on.
"""

from __future__ import annotations

import ast
import errno
import io
import os
import re
import stat
import sys
import tokenize
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trainwise.doctor.context import Context
from trainwise.doctor.rule import Finding, Rule
from trainwise.errors import TrainwiseError

PARSE_ERROR = "TW900"
SKIP_DIRS = frozenset({".venv", "venv", ".git", "build", "site-packages", "__pycache__", ".tox", ".nox",
                       ".mypy_cache", ".ruff_cache", ".pytest_cache", ".ipynb_checkpoints", "node_modules"})
SUFFIXES = (".py", ".ipynb")
CONFIG_KEYS = frozenset({"select", "ignore", "exclude", "unsafe-fixes"})
_NOQA = re.compile(r"#\s*noqa(?::[\s]?(?P<codes>[A-Z]+[0-9]+(?:[,\s]+[A-Z]+[0-9]+)*))?", re.IGNORECASE)
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
# Set by the tests: a rule that raises makes the run fail instead of becoming a TW900 finding.
STRICT = os.environ.get("TRAINWISE_DOCTOR_STRICT") == "1"


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
            return not any(_matches(code, p) for p in self.ignore)
        selected = any(_matches(code, p) for p in self.select) if self.select else default
        return selected and not any(_matches(code, p) for p in self.ignore)

    def rules(self) -> list[type[Rule]]:
        """The rule classes this configuration runs."""
        from trainwise.doctor.rules import all_rules

        return [r for r in all_rules() if r.code != PARSE_ERROR and self.enabled(r.code, default=r.default_enabled)]


def _matches(code: str, pattern: str) -> bool:
    return pattern == "ALL" or code.startswith(pattern)


def parse_codes(values: Iterable[str], *, option: str) -> tuple[str, ...]:
    """Split comma-separated codes and prefixes; raise ``TrainwiseError`` for one that matches no rule."""
    from trainwise.doctor.rules import all_rules

    codes = [r.code for r in all_rules()]
    out = []
    for value in values:
        for part in str(value).split(","):
            part = part.strip().upper()
            if not part:
                continue
            if part != "ALL" and not any(c.startswith(part) for c in codes):
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


def find_pyproject(start: Path) -> Path | None:
    """The nearest ``pyproject.toml`` at or above ``start`` that has a ``[tool.trainwise.doctor]`` table."""
    tomllib = None
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        try:
            if candidate.is_file() and "trainwise" in candidate.read_text(encoding="utf-8", errors="replace"):
                tomllib = tomllib or _tomllib()
                with candidate.open("rb") as fh:
                    data = tomllib.load(fh)
                if "doctor" in data.get("tool", {}).get("trainwise", {}):
                    return candidate
        except (OSError, ValueError):  # unreadable, or invalid TOML (TOMLDecodeError is a ValueError)
            continue
    return None


def load_config(start: Path | None = None) -> Config:
    """Settings of ``[tool.trainwise.doctor]`` (keys ``select``, ``ignore``, ``exclude``, ``unsafe-fixes``)."""
    path = find_pyproject(Path.cwd() if start is None else start)
    if path is None:
        return Config()
    with path.open("rb") as fh:
        table = _tomllib().load(fh)["tool"]["trainwise"]["doctor"]
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
    source: str | None = None  # decoded text (None when unreadable)
    encoding: str = "utf-8"
    parsed: bool = False  # False after a TW900: such a file is never modified
    notebook: bool = False


def parse_error(path: str, message: str, line: int = 1, column: int = 1, cell: int | None = None) -> Finding:
    """A ``TW900`` finding: the file could not be read or parsed."""
    return Finding(path, max(line, 1), max(column, 1), PARSE_ERROR, "unreadable-file", message, cell=cell)


def check_source(source: str, path: str = "<string>", *, config: Config | None = None,
                 rules: Sequence[type[Rule]] | None = None) -> list[Finding]:
    """Check Python source text; return its findings (a ``TW900`` one if it does not parse), noqa applied."""
    findings, _ = analyse(source, path, rules=(config or Config()).rules() if rules is None else rules)
    return findings


def analyse(source: str, path: str, *, rules: Sequence[type[Rule]]) -> tuple[list[Finding], bool]:
    """Parse and run ``rules`` in one pass; returns the findings and whether the source parsed."""
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as exc:
        line, col = exc.lineno or 1, exc.offset or 1
        return [parse_error(path, f"syntax error: {exc.msg}", line, col)], False
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes; too deeply nested to parse
        return [parse_error(path, f"cannot parse: {_describe(exc)}")], False
    findings: list[Finding] = []
    try:
        run_rules(Context(tree, source, path), rules, findings)
    except (RecursionError, MemoryError) as exc:
        return [parse_error(path, f"cannot analyse: {_describe(exc)}")], True
    except Exception as exc:  # a bug in a rule must not stop the other files
        if STRICT:
            raise
        return [parse_error(path, f"internal error while checking this file: {type(exc).__name__}: {exc}")], True
    findings.sort(key=Finding.sort_key)
    return apply_noqa(findings, _LINE_BREAK.split(source)), True


def run_rules(ctx: Context, rules: Sequence[type[Rule]], sink: list[Finding]) -> None:
    """Instantiate the rules for this file and dispatch every node to every rule that visits its type."""
    handlers: dict[type, list] = {}
    instances = []
    for rule_cls in rules:
        rule = rule_cls(ctx, sink)
        instances.append(rule)
        for node_type, method in rule_cls.visited_types().items():
            handlers.setdefault(node_type, []).append(getattr(rule, method))
    for node_type, methods in handlers.items():
        for node in ctx.nodes(node_type):
            for method in methods:
                method(node)
    for rule in instances:
        rule.finish()


def apply_noqa(findings: list[Finding], lines: list[str]) -> list[Finding]:
    """Drop findings whose line carries ``# noqa`` (all codes) or ``# noqa: TW101, TW302`` (those codes)."""
    kept = []
    for finding in findings:
        text = lines[finding.line - 1] if 0 < finding.line <= len(lines) else ""
        if "noqa" in text.lower():
            match = _NOQA.search(text)
            if match is not None:
                codes = match.group("codes")
                if codes is None or finding.code in {c.upper() for c in re.split(r"[,\s]+", codes)}:
                    continue
        kept.append(finding)
    return kept


def decode(data: bytes) -> tuple[str, str]:
    """Text and encoding of Python source bytes (PEP 263 cookie or BOM, else UTF-8)."""
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return data.decode(encoding), encoding


def check_file(path: str, config: Config | None = None, *, rules: Sequence[type[Rule]] | None = None) -> FileResult:
    """Check one ``.py`` file or ``.ipynb`` notebook given by its display path."""
    rules = (config or Config()).rules() if rules is None else rules
    result = FileResult(path, notebook=path.endswith(".ipynb"))
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        result.findings = [parse_error(path, f"cannot read: {_os_reason(exc)}")]
        return result
    if result.notebook:
        from trainwise.doctor.notebook import check_notebook

        result.findings, result.parsed = check_notebook(data, path, rules=rules)
        return result
    try:
        result.source, result.encoding = decode(data)
    except (SyntaxError, UnicodeDecodeError, LookupError) as exc:
        reason = "not valid UTF-8 (nor the encoding it declares)" if isinstance(exc, UnicodeDecodeError) else (
            f"bad encoding declaration: {exc}")
        result.findings = [parse_error(path, f"cannot decode: {reason}")]
        return result
    result.findings, result.parsed = analyse(result.source, path, rules=rules)
    return result


def check_paths(paths: Sequence[str], config: Config | None = None) -> list[FileResult]:
    """Check files and folders (recursively); results sorted by path, unreadable paths as TW900 findings."""
    config = config or Config()
    rules = config.rules()
    files, errors = discover(paths, exclude=config.exclude)
    results = [check_file(f, config, rules=rules) for f in files]
    results.extend(FileResult(e.path, [e]) for e in errors)
    for result in results:
        result.findings = [f for f in result.findings if config.enabled(f.code)]
        result.findings.sort(key=Finding.sort_key)
    results.sort(key=lambda r: r.path)
    return results


# ------------------------------------------------------------------------------------------------ discovery
@dataclass
class _IgnoreRule:
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool


def _glob_to_regex(pattern: str) -> str:
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end == -1:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : end].replace("\\", "\\\\")
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                i = end
        elif c == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def parse_gitignore(lines: Iterable[str]) -> list[_IgnoreRule]:
    """Rules of a ``.gitignore`` (comments, ``!`` negation, trailing ``/`` for folders, anchoring, ``**``)."""
    rules = []
    for raw in lines:
        line = raw.rstrip("\n\r")
        if not line.strip() or line.startswith("#"):
            continue
        line = line.rstrip(" ") if not line.endswith("\\ ") else line
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        body = _glob_to_regex(line.lstrip("/"))
        regex = re.compile(body if anchored else f"(?:.*/)?{body}")
        rules.append(_IgnoreRule(regex, negate, dir_only))
    return rules


@dataclass
class _IgnoreSet:
    base: str  # the folder the patterns are relative to
    rules: list[_IgnoreRule]


def _ignored(path: str, is_dir: bool, ignore_sets: list[_IgnoreSet]) -> bool:
    verdict = False
    for ignore_set in ignore_sets:
        rel = os.path.relpath(path, ignore_set.base).replace(os.sep, "/")
        if rel.startswith("../"):
            continue
        for rule in ignore_set.rules:
            if rule.dir_only and not is_dir:
                continue
            if rule.regex.fullmatch(rel):
                verdict = not rule.negate
    return verdict


def _read_gitignore(folder: str) -> _IgnoreSet | None:
    try:
        with open(os.path.join(folder, ".gitignore"), encoding="utf-8", errors="replace") as fh:
            return _IgnoreSet(folder, parse_gitignore(fh))
    except OSError:
        return None


def _ancestor_ignores(folder: str) -> list[_IgnoreSet]:
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
    extra = [_IgnoreSet(os.getcwd(), parse_gitignore(exclude))] if exclude else []
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
        else:
            files.append(path)
    unique = sorted(dict.fromkeys(files))
    return unique, errors


def _walk(folder: str, ignore_sets: list[_IgnoreSet], ancestors: set[tuple[int, int]], visited: set[tuple[int, int]],
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
            if entry.name in SKIP_DIRS or entry.name.endswith(".egg-info") or _ignored(path, True, ignore_sets):
                continue
            key = (st.st_dev, st.st_ino)
            if key in ancestors:
                errors.append(parse_error(path, "symbolic link loop (links back to a folder above), skipped"))
                continue
            if key in visited:
                continue
            visited.add(key)
            _walk(path, ignore_sets, ancestors | {key}, visited, files, errors)
        elif stat.S_ISREG(st.st_mode) and entry.name.endswith(SUFFIXES) and not _ignored(path, False, ignore_sets):
            files.append(path)


def _os_reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _describe(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "too deeply nested (RecursionError)"
    if isinstance(exc, MemoryError):
        return "too large or too deeply nested (MemoryError)"
    return str(exc) or type(exc).__name__


__all__ = ["Config", "FileResult", "analyse", "check_file", "check_paths", "check_source", "discover",
           "load_config", "parse_codes"]
