"""Git's ignore rules, read the way git reads them: ``.gitignore`` lines (comments, ``!`` negation, a trailing
``/`` for folders, anchoring, ``**``, bracket expressions with git's wildmatch rules and POSIX classes) turned
into regular expressions, and the verdict for a path under several ``.gitignore`` files (the last matching
rule wins). The engine's file discovery (``engine.discover``) reads the files; this module only matches.
"""

from __future__ import annotations

import os
import re
import string
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass
class IgnoreRule:
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool


# Git's character classes inside brackets ([[:alpha:]]), ASCII only as in git's wildmatch.
_POSIX_CLASSES = {
    "alnum": string.ascii_letters + string.digits,
    "alpha": string.ascii_letters,
    "blank": " \t",
    "cntrl": "".join(map(chr, range(32))) + "\x7f",
    "digit": string.digits,
    "graph": "".join(map(chr, range(33, 127))),
    "lower": string.ascii_lowercase,
    "print": "".join(map(chr, range(32, 127))),
    "punct": string.punctuation,
    "space": " \t\n\r\x0b\x0c",
    "upper": string.ascii_uppercase,
    "xdigit": string.hexdigits,
}


def _bracket_to_regex(pattern: str, i: int) -> tuple[str, int] | None:
    """The regex of the bracket expression whose ``[`` is just before ``pattern[i]``, and the index after its
    ``]``; None when it is malformed (no closing ``]``, an unknown ``[:class:]``), as git's wildmatch reads it:
    a ``]`` right after ``[`` or ``[!`` is a member, ``-`` at either end is literal, ``z-a`` holds only ``z``."""
    n = len(pattern)
    negated = i < n and pattern[i] in "!^"
    i += negated
    members: set[str] = set()
    ranges: list[tuple[str, str]] = []
    prev: str | None = None  # the member a following "-" starts a range from
    first = True
    while True:
        if i >= n:
            return None
        c = pattern[i]
        if c == "]" and not first:
            break
        first = False
        if c == "\\":
            i += 1
            if i >= n:
                return None
            members.add(pattern[i])
            prev = pattern[i]
        elif c == "-" and prev is not None and i + 1 < n and pattern[i + 1] != "]":
            i += 1
            if pattern[i] == "\\":
                i += 1
                if i >= n:
                    return None
            ranges.append((prev, pattern[i]))
            prev = None
        elif c == "[" and pattern.startswith(":", i + 1):
            end = pattern.find("]", i + 2)
            if end == -1:
                return None
            if end - (i + 2) < 1 or pattern[end - 1] != ":":  # no ":]": the "[" is a plain member
                members.add(c)
                prev = c
            else:
                name = pattern[i + 2 : end - 1]
                if name not in _POSIX_CLASSES:
                    return None
                members.update(_POSIX_CLASSES[name])
                prev = None
                i = end
        else:
            members.add(c)
            prev = c
        i += 1
    body = "".join(re.escape(m) for m in sorted(members))
    body += "".join(f"{re.escape(lo)}-{re.escape(hi)}" for lo, hi in ranges if lo <= hi)
    if negated:
        return f"[^{body}/]", i + 1
    return (f"(?!/)[{body}]" if body else "(?!)"), i + 1


def _wildmatch_to_regex(pattern: str, start: int = 0) -> str | None:
    """A regex that matches what git's wildmatch (with WM_PATHNAME) matches, or None for a pattern that
    matches nothing (malformed brackets, a trailing backslash). ``*`` and ``?`` stop at ``/``; ``**`` matches
    across folders only as a whole segment (``**/x``, ``x/**``, ``x/**/y``), or where it starts at ``start``,
    the end of the literal prefix that git compares separately (so ``foo**/bar`` matches ``foo/a/bar``)."""
    out = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            if i + 1 >= n:
                return None
            out.append(re.escape(pattern[i + 1]))
            i += 2
        elif c == "*":
            j = i
            while j < n and pattern[j] == "*":
                j += 1
            segment = i == start or pattern[i - 1] == "/"
            if j - i >= 2 and segment and (j == n or pattern.startswith(("/", "\\/"), j)):
                if j == n:
                    out.append(".*")
                else:
                    out.append("(?:.*/)?")
                    j += 1 if pattern[j] == "/" else 2
            else:
                out.append("[^/]*")
            i = j
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            bracket = _bracket_to_regex(pattern, i + 1)
            if bracket is None:
                return None
            regex, i = bracket
            out.append(regex)
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def _trim_trailing_spaces(line: str) -> str:
    """Drop trailing spaces unless escaped with a backslash (git's trim_trailing_spaces)."""
    last_space = None
    i = 0
    while i < len(line):
        c = line[i]
        if c == " ":
            if last_space is None:
                last_space = i
        elif c == "\\":
            i += 1
            if i >= len(line):
                return line
            last_space = None
        else:
            last_space = None
        i += 1
    return line if last_space is None else line[:last_space]


def parse_gitignore(lines: Iterable[str]) -> list[IgnoreRule]:
    """Rules of a ``.gitignore`` as git reads them (comments, ``!`` negation, trailing ``/`` for folders,
    anchoring, ``**``, brackets with git's wildmatch rules). Any line is accepted: a pattern git would
    never match (``[]``, ``[a-``, a trailing ``\\``) is left out rather than raising."""
    rules = []
    for raw in lines:
        line = raw.rstrip("\n")
        line = line[:-1] if line.endswith("\r") else line
        if not line or line.startswith("#"):
            continue
        line = _trim_trailing_spaces(line)
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        dir_only = line.endswith("/")
        if dir_only:
            line = line[:-1]
        if not line:
            continue
        anchored = "/" in line  # a slash anywhere but at the end ties the pattern to this folder
        if line.startswith("/"):
            line = line[1:]
        if anchored:
            literal_end = next((k for k, ch in enumerate(line) if ch in "*?[\\"), len(line))
            body = _wildmatch_to_regex(line, literal_end)
        else:
            body = _wildmatch_to_regex(line)
        if body is None:
            continue
        try:
            regex = re.compile(body if anchored else f"(?:.*/)?{body}", re.DOTALL)
        except re.error:  # pragma: no cover - every piece is escaped; kept so that no pattern can crash a run
            continue
        rules.append(IgnoreRule(regex, negate, dir_only))
    return rules


@dataclass
class IgnoreSet:
    base: str  # the folder the patterns are relative to
    rules: list[IgnoreRule]


def ignored(path: str, is_dir: bool, ignore_sets: list[IgnoreSet]) -> bool:
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
