"""``trainwise doctor [PATH ...]``: find the classic training-loop mistakes in scripts and notebooks.

Exit 0 without findings, 1 with findings, 2 on a usage error (a path that does not exist among them).
Never imports torch.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "doctor",
        help="check training scripts and notebooks for classic PyTorch mistakes",
        description="Check Python files and Jupyter notebooks for the classic mistakes of hand-written PyTorch "
        "training loops (see docs/doctor.md). Exit 0 without findings, 1 with findings, 2 on a usage error.",
    )
    parser.add_argument("paths", nargs="*", metavar="PATH", help="files or folders to check (default: .)")
    parser.add_argument("--select", action="append", default=None, metavar="CODES",
                        help="only these codes or prefixes, comma-separated (TW101,TW3); replaces the config's")
    parser.add_argument("--ignore", action="append", default=None, metavar="CODES",
                        help="leave out these codes or prefixes, comma-separated; adds to the config's")
    parser.add_argument("--format", choices=("text", "json", "sarif", "github"), default="text",
                        help="output format (default text: path:line:col: CODE message)")
    parser.add_argument("--fix", action="store_true", help="apply safe fixes (formatting and comments kept)")
    parser.add_argument("--unsafe-fixes", action="store_true", help="with --fix or --diff, apply unsafe fixes too")
    parser.add_argument("--diff", action="store_true", help="print the fixes as a unified diff; write nothing")
    parser.add_argument("--explain", metavar="CODE", help="print a rule's documentation and exit")
    parser.add_argument("--list-rules", action="store_true", help="list the rules and exit")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    with _current_folder_off_sys_path():
        return _run(args)


@contextlib.contextmanager
def _current_folder_off_sys_path() -> Iterator[None]:
    """``python -m`` puts the current folder first on ``sys.path``, so a checked project's own ``tomllib.py``,
    ``libcst.py`` or ``tokenize.py`` would run when the doctor imports that module. The doctor reads code, it
    never runs it: while it works, the current folder is not searched for modules."""
    try:
        here = os.path.realpath(os.getcwd())
    except OSError:
        here = None
    saved = list(sys.path)
    sys.path[:] = [p for p in saved if p not in ("", ".") and (here is None or os.path.realpath(p) != here)]
    try:
        yield
    finally:
        added = [p for p in sys.path if p not in saved]
        sys.path[:] = saved + added


def _run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from trainwise.doctor import engine
    from trainwise.doctor.report import render
    from trainwise.doctor.rules import all_rules, rule_for
    from trainwise.errors import TrainwiseError, printable

    if args.explain:
        rule = rule_for(args.explain)
        if rule is None:
            codes = ", ".join(r.code for r in all_rules())
            raise TrainwiseError(f"--explain: no rule {args.explain!r}; the codes are {codes}.")
        print(f"# {rule.code} {rule.name}\n\n{rule.documentation()}")
        from trainwise.labs import lab_for_code

        lab = lab_for_code(rule.code)
        if lab is not None:
            print(f"\nSee it measured, the wrong way and the right way: trainwise lab {lab.name}")
        return 0
    if args.list_rules:
        for rule in all_rules():
            print(f"{rule.code}  {rule.name:40}  {rule.summary()}")
        return 0
    config = engine.load_config()
    if args.select:
        config = replace(config, select=engine.parse_codes(args.select, option="--select"))
    if args.ignore:
        config = replace(config, ignore=config.ignore + engine.parse_codes(args.ignore, option="--ignore"))
    if args.unsafe_fixes:
        config = replace(config, unsafe_fixes=True)
    for path in args.paths:  # a typo on the command line is a usage error; an unreadable file is a finding
        if not os.path.lexists(path):
            raise TrainwiseError(f"{printable(path)} does not exist; check the path.")
    given = args.paths or ["."]
    results = engine.check_paths(given, config)
    if args.fix or args.diff:
        return _fix(results, config, args, given)
    findings = [f for r in results for f in r.findings]
    render(findings, _Out(sys.stdout), fmt=args.format, files=len(results))
    return 1 if findings else 0


class _Out:
    """``sys.stdout`` that writes what its encoding cannot hold as backslash escapes instead of raising: a file
    name that is not valid UTF-8 reaches Python as lone surrogates, and so may a string in a notebook."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except UnicodeEncodeError:
            encoding = getattr(self._stream, "encoding", None) or "utf-8"
            return self._stream.write(text.encode(encoding, "backslashreplace").decode(encoding, "replace"))

    def flush(self) -> None:
        self._stream.flush()


def _fix(results: list, config: Any, args: argparse.Namespace, given: list[str]) -> int:
    """Apply (or with --diff, show) the fixes to the regular files inside ``given``, the paths on the command
    line (a link, or a file reached through one out of them, is skipped and named); then report what is left."""
    from trainwise.doctor import engine
    from trainwise.doctor.fix import (
        apply_fixes,
        fixes_to_apply,
        import_libcst,
        refusal_to_rewrite,
        unified_diff,
        write_fixed,
    )
    from trainwise.doctor.report import render
    from trainwise.errors import printable

    import_libcst()
    remaining = []
    written: list[str] = []
    fixed = changed_files = 0
    for result in results:
        fixes = fixes_to_apply(result.findings, unsafe=config.unsafe_fixes)
        if not fixes or not result.parsed or result.notebook or result.source is None:
            remaining.extend(result.findings)
            continue
        new_source, applied = apply_fixes(result.source, fixes)
        if not applied or new_source == result.source:
            remaining.extend(result.findings)
            continue
        refusal = refusal_to_rewrite(result.path, given)  # asked as late as possible: just before the write
        if refusal is not None:
            print(f"trainwise doctor: skipped {printable(result.path)}: {refusal}; --fix rewrites only regular files "
                  "inside the paths it is given.", file=sys.stderr)
            remaining.extend(result.findings)
            continue
        fixed += applied
        changed_files += 1
        if args.diff:
            _Out(sys.stdout).write(unified_diff(result.path, result.source, new_source))
            remaining.extend(f for f in result.findings if f.fix not in fixes)
            continue
        write_fixed(result.path, new_source.encode(result.encoding), fixed_before=changed_files - 1)
        written.append(result.path)
    # The files written are checked again with every file of the run, so that findings across files stay.
    program_files = [r.path for r in results if r.parsed or r.source is not None or r.notebook]
    for after in engine.check_in_program(written, program_files, config):
        remaining.extend(f for f in after.findings if config.enabled(f.code))
    if args.diff:
        print(f"{fixed} fix{'es' if fixed != 1 else ''} would be applied in {changed_files} "
              f"file{'s' if changed_files != 1 else ''}; {len(remaining)} finding"
              f"{'s' if len(remaining) != 1 else ''} without a fix.", file=sys.stderr)
        return 1 if fixed or remaining else 0
    remaining.sort(key=lambda f: f.sort_key())
    render(remaining, _Out(sys.stdout), fmt=args.format, files=len(results))
    if args.format == "text":
        print(f"Fixed {fixed} problem{'s' if fixed != 1 else ''} in {changed_files} "
              f"file{'s' if changed_files != 1 else ''}.")
    return 1 if remaining else 0
