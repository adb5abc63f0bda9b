"""What ``trainwise run`` says: the doctor's findings on the script before it runs, each guard finding when it is
found, and at exit one report (a table, or json, sarif, github) that says which static findings the run confirmed
(same code, same file and line), which it did not see, and what only the run found; under torchrun, the ranks that
saw each finding, gathered through files (docs/run.md)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainwise.doctor.engine import code_matches, parse_codes

if TYPE_CHECKING:
    from trainwise.doctor.rule import Finding
    from trainwise.guards.auto import LocatedFinding

PREFIX = "trainwise run:"
GATHER_WAIT_S = 60.0  # how long the reporting rank waits for the other ranks' findings after its script ended


@dataclasses.dataclass(frozen=True)
class Selection:
    """``--select``, ``--ignore`` and ``--fail-on``: codes or prefixes (``ALL``; ``ANY`` for ``--fail-on``)."""

    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    fail_on: tuple[str, ...] = ()

    @classmethod
    def parse(cls, *, select: Sequence[str] | None, ignore: Sequence[str] | None,
              fail_on: Sequence[str] | None) -> Selection:
        """Split comma-separated values; a value that matches no doctor rule and no guard is one sentence."""
        guards = _guard_codes()
        return cls(parse_codes(select, option="--select", guards=guards),
                   parse_codes(ignore, option="--ignore", guards=guards),
                   parse_codes(fail_on, option="--fail-on", guards=guards, also=("ANY",)))

    def enabled(self, code: str) -> bool:
        """Whether ``code`` is selected and not ignored."""
        selected = any(code_matches(code, p) for p in self.select) if self.select else True
        return selected and not any(code_matches(code, p) for p in self.ignore)

    def fails(self, code: str) -> bool:
        """Whether a finding with ``code`` makes ``--fail-on`` exit 1."""
        return any(p == "ANY" or code_matches(code, p) for p in self.fail_on)

    def guard_codes(self) -> list[str]:
        """The runtime checks to run."""
        return [code for code in _guard_codes() if self.enabled(code)]


def _guard_codes() -> list[str]:
    from trainwise.guards.registry import all_check_classes

    return [cls.code for cls in all_check_classes()]


MAX_PROGRAM_FILES = 500  # files read with the script as one program, at most (else the script alone)


def static_findings(source: str, selection: Selection) -> list[Finding]:
    """The doctor's findings on ``source``, with the project's ``[tool.trainwise.doctor]`` settings, read with the
    modules beside it as one program (a helper module or package next to the script counts): the ``.py`` files of
    its folder and the packages in it, as ``trainwise doctor`` finds them there; the script alone when they are
    more than ``MAX_PROGRAM_FILES`` (a script in a home or temporary folder)."""
    from trainwise.doctor import engine
    from trainwise.doctor.program import Program

    folder = os.path.dirname(os.path.abspath(source))
    config = engine.load_config(Path(folder))
    config = dataclasses.replace(config, select=selection.select or config.select,
                                 ignore=config.ignore + selection.ignore)
    path = _shown(source)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        names = []
    beside = [os.path.join(folder, n) for n in names
              if n.endswith(".py") or os.path.isfile(os.path.join(folder, n, "__init__.py"))]
    files: list[str] = []
    if len(beside) <= MAX_PROGRAM_FILES:
        files, _ = engine.discover([_shown(p) for p in beside], exclude=config.exclude)
    if len(files) > MAX_PROGRAM_FILES:
        files = []
    files = [f for f in files if os.path.abspath(f) != os.path.abspath(source)]
    result = engine.check_file(path, config, program=Program([path, *files], engine.read_source))
    return [f for f in result.findings if selection.enabled(f.code)]


def _shown(path: str) -> str:
    from trainwise.guards.auto import shown_path

    return shown_path(os.path.abspath(path))


@dataclasses.dataclass(frozen=True)
class Ranks:
    """This process under torchrun (rank, local rank, sizes; one process without it) and the folder where the
    ranks of one node leave their findings for the local rank 0, which reports them all."""

    rank: int = 0
    local_rank: int = 0
    world: int = 1
    local_world: int = 1
    folder: str = ""

    @classmethod
    def from_environment(cls) -> Ranks:
        env = os.environ
        try:
            rank, local = int(env.get("RANK", "0")), int(env.get("LOCAL_RANK", env.get("RANK", "0")))
            world = int(env.get("WORLD_SIZE", "1"))
            local_world = int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", "1")))
        except ValueError:
            return cls()
        if world <= 1:
            return cls()
        # one launch of one node: the agent (every rank's parent), its run id, port and restart
        key = "-".join([env.get("TORCHELASTIC_RUN_ID", "none"), env.get("MASTER_PORT", ""), str(os.getppid()),
                        env.get("TORCHELASTIC_RESTART_COUNT", "0")])
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
        return cls(rank, local, world, local_world, os.path.join(tempfile.gettempdir(), f"trainwise-run-{safe}"))

    @property
    def reports(self) -> bool:
        """Whether this process writes the report (the local rank 0; the only process without torchrun)."""
        return self.local_rank == 0

    def gather(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """On the reporting rank: every local rank's rows merged by code and place, each with its ``ranks``;
        on the others: their rows left for it in the folder (nothing to report)."""
        for row in rows:
            row["ranks"] = [self.rank]
        if self.local_world <= 1:
            return rows
        from trainwise.files import atomic_write_json

        if not self.reports:
            os.makedirs(self.folder, exist_ok=True)
            atomic_write_json(os.path.join(self.folder, f"rank-{self.rank}.json"), rows)
            return []
        merged = {_key(row): row for row in rows}
        deadline = time.monotonic() + GATHER_WAIT_S
        seen: set[str] = set()
        while len(seen) < self.local_world - 1 and time.monotonic() < deadline:
            names = [n for n in _listdir(self.folder) if n.startswith("rank-") and n.endswith(".json")]
            for name in sorted(set(names) - seen):
                seen.add(name)
                path = os.path.join(self.folder, name)
                with open(path, encoding="utf-8") as fh:
                    for row in json.load(fh):
                        kept = merged.setdefault(_key(row), row)
                        if kept is not row:
                            kept["ranks"] = sorted(set(kept["ranks"]) | set(row["ranks"]))
                os.remove(path)
            if len(seen) < self.local_world - 1:
                time.sleep(0.05)
        with contextlib.suppress(OSError):
            os.rmdir(self.folder)
        missing = self.local_world - 1 - len(seen)
        if missing:
            print(f"{PREFIX} {missing} rank(s) left no findings within {GATHER_WAIT_S:.0f} s (did they end?); the "
                  f"report holds the others'.", file=sys.stderr)
        return list(merged.values())


def _listdir(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _key(row: dict[str, Any]) -> tuple[str, str, int]:
    return row["code"], row["path"], row["line"]


def _row(located: LocatedFinding) -> dict[str, Any]:
    place = located.place
    finding = located.finding
    return {"code": finding.code, "path": place.path if place else "", "line": place.line if place else 0,
            "where": finding.where, "step": finding.step, "message": finding.message,
            "callers": [list(caller) for caller in place.callers] if place else []}


class RunReport:
    """Says the static findings before the run, each guard finding when found (text format), and the report at
    exit; decides the exit status."""

    def __init__(self, selection: Selection, static: list[Finding], ranks: Ranks, *, fmt: str = "text",
                 output: str | None = None, target: str = "") -> None:
        self.selection, self.static, self.ranks = selection, static, ranks
        self.fmt, self.target = fmt, target
        self.output = os.path.abspath(output) if output else None  # before the script can change folder
        self.failure: str | None = None  # the exception that ended the script, in one line (after_run)
        self.watched = (0, 0)

    def before_run(self) -> None:
        """The doctor's findings, one line each (on the reporting rank, unless stderr is for the report)."""
        if not self._says_as_found():
            return
        from trainwise.doctor.report import location

        for finding in self.static:
            _say(f"{PREFIX} doctor: {location(finding)}: {finding.code} {finding.message}")

    def live(self, located: LocatedFinding) -> None:
        """One guard finding, as it is found (on the reporting rank, unless stderr is for the report)."""
        if not self._says_as_found():
            return
        finding = located.finding
        place = located.place.shown() if located.place else "(no line of the script)"
        where = f"{finding.where}, " if finding.where else ""
        _say(f"{PREFIX} {place}: {finding.code} {finding.message} ({where}step {finding.step})")

    def interrupted(self) -> None:
        """Say that a KeyboardInterrupt ended the script, before the report (which holds what ran until then)."""
        if self._says_as_found():
            _say(f"{PREFIX} {self.target} was interrupted (KeyboardInterrupt): the report holds what ran until then; "
                 "the process then ends by SIGINT, as python's does.")

    def _says_as_found(self) -> bool:
        return self.ranks.reports and (self.fmt == "text" or self.output is not None)

    def after_run(self, located: list[LocatedFinding], status: int, *, failure: str | None = None,
                  watched: tuple[int, int] = (0, 0)) -> int:
        """Gather the ranks' findings, write the report, and return the exit status: the script's, or 1 when it
        succeeded and a finding matches ``--fail-on``. ``failure``: the exception that ended the script, in one
        line; ``watched``: the models guarded and the most steps one took (what was checked until then)."""
        self.failure, self.watched = failure, watched
        if failure is not None and self.fmt != "text" and self.output is not None and self.ranks.reports:
            _say(self.failed_line())
        own = [_row(f) for f in located]
        failing = any(self.selection.fails(row["code"]) for row in own)  # each rank's status: its own findings
        rows = self.ranks.gather(own)
        failing = failing or any(self.selection.fails(row["code"]) for row in rows)
        if self.ranks.reports:
            rows.sort(key=lambda r: (r["path"], r["line"], r["code"]))
            failing = failing or any(self.selection.fails(f.code) for f in self.static)
            entries = self._entries(rows)
            text = _FORMATS[self.fmt](entries, self)
            if self.output:
                from trainwise.files import atomic_write_bytes

                atomic_write_bytes(self.output, text.encode("utf-8"))
            else:
                _say(text.rstrip("\n"))
        return 1 if status == 0 and failing else status

    def failed_line(self, *, found: bool = False) -> str:
        """The script failed: which exception, and what was watched until then (never "no problems found")."""
        models, steps = self.watched
        if not models:
            checked = "no model was called"
        else:
            over = "over" if models == 1 else "over up to"
            checked = f"{models} model{'s' * (models > 1)} watched {over} {steps} step{'s' * (steps != 1)}"
        until = "found until then" if found else "nothing found until then"
        return f"{PREFIX} {self.target}: the script failed ({self.failure}); {until} ({checked})."

    def _entries(self, rows: list[dict[str, Any]]) -> list[Entry]:
        """Static findings and runtime rows together: a static finding and the runtime one with the same code in
        the same file on the code path that ran are one entry (:func:`run_pairing.pair`): the doctor names the
        cause (``total += loss``), the run the line where it shows (the step)."""
        from trainwise.cli.run_pairing import pair
        from trainwise.guards.auto import absolute_path

        static = list({(f.code, absolute_path(f.path), f.line): f for f in self.static}.values())  # one a place
        pairs = pair(static, rows, absolute_path)
        paired_static, paired_rows = {id(f) for f, _ in pairs}, {id(r) for _, r in pairs}
        entries = [Entry(row["code"], row["path"], finding.line, row, finding) for finding, row in pairs]
        entries += [Entry(f.code, absolute_path(f.path), f.line, None, f) for f in static
                    if id(f) not in paired_static]
        entries += [Entry(row["code"], row["path"], row["line"], row, None) for row in rows
                    if id(row) not in paired_rows]
        entries.sort(key=lambda e: (e.found != "both", e.found != "run", e.path, e.line, e.code))
        return entries


@dataclasses.dataclass
class Entry:
    """One line of the report: a static finding, a runtime one, or both at the same place."""

    code: str
    path: str
    line: int
    run: dict[str, Any] | None
    static: Finding | None

    @property
    def found(self) -> str:
        """``both`` (the run confirmed the doctor), ``run`` (only the run) or ``static`` (the run did not see it)."""
        return "both" if self.run and self.static else ("run" if self.run else "static")

    @property
    def message(self) -> str:
        return self.run["message"] if self.run else self.static.message  # type: ignore[union-attr]

    @property
    def run_line(self) -> int | None:
        """The line the run found it at, when another than the doctor's."""
        return self.run["line"] if self.run and self.static and self.run["line"] != self.line else None

    def place(self) -> str:
        from trainwise.guards.auto import shown_path

        return f"{shown_path(self.path)}:{self.line}" if self.path else "(no line of the script)"

    def status(self) -> str:
        """In words: confirmed (at which line), run only, or static only."""
        if self.found == "both" and self.run_line is not None:
            return f"confirmed by the run at line {self.run_line}"
        return _STATUS[self.found]

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"code": self.code, "path": _shown_or_empty(self.path), "line": self.line,
                                "found": self.found, "message": self.message}
        if self.static is not None:
            data["column"] = self.static.column
        if self.run is not None:
            data.update(step=self.run["step"], where=self.run["where"], ranks=self.run["ranks"],
                        run_line=self.run["line"])
        return data

    def as_doctor_finding(self) -> Finding:
        """This entry as a doctor ``Finding`` (for the sarif and github writers)."""
        from trainwise.doctor.rule import Finding
        from trainwise.doctor.rules import rule_for

        if self.static is not None and self.run is None:
            return self.static
        rule = rule_for(self.code)
        seen = {"both": "confirmed at run time", "run": "at run time"}[self.found]
        message = f"{self.message} ({seen}: step {self.run['step']}, ranks {_ranks(self.run)})"  # type: ignore[index]
        return Finding(path=_shown_or_empty(self.path) or "<unknown>", line=max(self.line, 1),
                       column=self.static.column if self.static else 1, code=self.code,
                       name=rule.name if rule else self.code, message=message)


_STATUS = {"both": "confirmed by the run", "run": "run only", "static": "static, not seen at run time"}


def _shown_or_empty(path: str) -> str:
    from trainwise.guards.auto import shown_path

    return shown_path(path) if path else ""


def _ranks(row: dict[str, Any]) -> str:
    return ",".join(str(r) for r in row["ranks"])


def _render_text(entries: list[Entry], report: RunReport) -> str:
    counts = {kind: sum(e.found == kind for e in entries) for kind in ("both", "run", "static")}
    summary = (f"{PREFIX} {report.target}: {counts['both']} static finding(s) confirmed by the run, "
               f"{counts['run']} found only at run time, {counts['static']} static not seen at run time.")
    if report.failure is not None:  # a script that died is never said to be clean
        if not entries:
            return report.failed_line() + "\n"
        summary = report.failed_line(found=True)[:-1] + ":\n" + summary
    elif not entries:
        return f"{PREFIX} {report.target}: no problems found, statically or at run time.\n"
    distributed = report.ranks.world > 1
    header = ["code", "place", "found", "step"] + (["ranks"] if distributed else [])
    table = [header]
    for entry in entries:
        step = str(entry.run["step"]) if entry.run else ""
        table.append([entry.code, entry.place(), entry.status(), step]
                     + ([_ranks(entry.run) if entry.run else ""] if distributed else []))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    return "\n".join([summary, *lines]) + "\n"


def _render_json(entries: list[Entry], report: RunReport) -> str:
    return json.dumps([e.to_dict() for e in entries], indent=2) + "\n"


def _render_sarif(entries: list[Entry], report: RunReport) -> str:
    from trainwise.doctor.report import sarif

    log = sarif([e.as_doctor_finding() for e in entries])
    log["runs"][0]["tool"]["driver"]["name"] = "trainwise-run"
    for result, entry in zip(log["runs"][0]["results"], entries):
        result.setdefault("properties", {}).update({"found": entry.found, **(
            {"step": entry.run["step"], "ranks": entry.run["ranks"]} if entry.run else {})})
    return json.dumps(log, indent=2) + "\n"


def _render_github(entries: list[Entry], report: RunReport) -> str:
    import io

    from trainwise.doctor.report import render_github

    out = io.StringIO()
    render_github([e.as_doctor_finding() for e in entries], out)
    return out.getvalue()


_FORMATS = {"text": _render_text, "json": _render_json, "sarif": _render_sarif, "github": _render_github}


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
