"""Output formats of ``trainwise doctor``: text (``path:line:col: CODE message``), json, sarif and github."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TextIO

from trainwise.doctor.rule import Finding, Related

FORMATS = ("text", "json", "sarif", "github")


def location(finding: Finding) -> str:
    """``path:line:col``, or ``path:cell N:line:col`` inside a notebook."""
    cell = f"cell {finding.cell}:" if finding.cell is not None else ""
    return f"{finding.path}:{cell}{finding.line}:{finding.column}"


def related_location(related: Related) -> str:
    """``path:line:col`` of another place a finding names (``path:cell N:line:col`` in a notebook)."""
    return f"{related.where()}:{related.column}"


def render_text(findings: Sequence[Finding], out: TextIO, *, files: int, summary: bool = True) -> None:
    """One line per finding (and an indented ``note`` line for each other place it names), then a summary."""
    for finding in findings:
        out.write(f"{location(finding)}: {finding.code} {finding.message}\n")
        for related in finding.related:
            out.write(f"  {related_location(related)}: note: {related.message}\n")
    if not summary:
        return
    noun = "file" if files == 1 else "files"
    if not findings:
        out.write(f"No problems found in {files} {noun}.\n")
        return
    fixable = sum(1 for f in findings if f.fix is not None and f.fix.safe)
    unsafe = sum(1 for f in findings if f.fix is not None and not f.fix.safe)
    parts = [f"Found {len(findings)} problem{'s' if len(findings) != 1 else ''} in {files} {noun}"]
    if fixable:
        parts.append(f"{fixable} fixable with --fix")
    if unsafe:
        parts.append(f"{unsafe} more with --fix --unsafe-fixes")
    out.write("; ".join(parts) + ".\n")


def render_json(findings: Sequence[Finding], out: TextIO) -> None:
    """One JSON array of objects with keys path, line, column, code, name, message, fixable (and cell)."""
    json.dump([f.to_dict() for f in findings], out, indent=2)
    out.write("\n")


def sarif(findings: Sequence[Finding]) -> dict[str, Any]:
    """A SARIF 2.1.0 log (for GitHub code scanning and other viewers)."""
    from trainwise._version import __version__
    from trainwise.doctor.rules import all_rules

    rules = all_rules()
    index = {r.code: i for i, r in enumerate(rules)}
    descriptors = [
        {
            "id": r.code,
            "name": r.name,
            "shortDescription": {"text": r.summary()},
            "fullDescription": {"text": r.documentation()},
            "help": {"text": r.documentation(), "markdown": r.documentation()},
            "defaultConfiguration": {"level": "error"},
        }
        for r in rules
    ]
    results = []
    for f in findings:
        result: dict[str, Any] = {
            "ruleId": f.code,
            "level": "error",
            "message": {"text": f.message},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": f.path.replace("\\", "/")},
                        "region": {"startLine": f.line, "startColumn": f.column},
                    }
                }
            ],
        }
        if f.related:
            result["relatedLocations"] = [
                {
                    "id": number,
                    "message": {"text": r.message},
                    "physicalLocation": {
                        "artifactLocation": {"uri": r.path.replace("\\", "/")},
                        "region": {"startLine": r.line, "startColumn": r.column},
                    },
                    **({"properties": {"cell": r.cell}} if r.cell is not None else {}),
                }
                for number, r in enumerate(f.related, start=1)
            ]
        if f.code in index:
            result["ruleIndex"] = index[f.code]
        if f.cell is not None:
            result["properties"] = {"cell": f.cell}
        results.append(result)
    return {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "trainwise-doctor",
                        "version": __version__,
                        "rules": descriptors,
                    }
                },
                "results": results,
            }
        ],
    }


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def render_github(findings: Sequence[Finding], out: TextIO) -> None:
    """GitHub Actions workflow commands: one ``::error`` annotation per finding."""
    for f in findings:
        title = _escape_property(f"trainwise doctor ({f.code} {f.name})")
        where = f"file={_escape_property(f.path)},line={f.line},col={f.column}"
        text = f"{location(f)}: {f.code} {f.message}" + "".join(
            f"\n{related_location(r)}: note: {r.message}" for r in f.related)
        out.write(f"::error title={title},{where}::{_escape_data(text)}\n")


def render(findings: Sequence[Finding], out: TextIO, *, fmt: str = "text", files: int = 0) -> None:
    """Write ``findings`` in one of ``FORMATS``."""
    if fmt == "json":
        render_json(findings, out)
    elif fmt == "sarif":
        json.dump(sarif(findings), out, indent=2)
        out.write("\n")
    elif fmt == "github":
        render_github(findings, out)
    else:
        render_text(findings, out, files=files)
