"""By hand, not in CI: run the doctor on the public repositories the shapes of ``shapes/`` were drawn from.

Usage: .venv/bin/python tests/doctor/check_public_sources.py MIRROR_ROOT [SLUG ...] [--head]

MIRROR_ROOT holds each repository named in a ``shapes/<slug>/SOURCE.json`` as ``owner+name/repo``: a bare git
directory, or a clone whose git directory is ``repo/.git`` (as the fetch tool leaves them). For each repository,
the Python files, notebooks and project files (which say what torch the project declares: TW301) of the commit
SOURCE.json names (or of HEAD, when the snapshot lacks that commit or ``--head`` is given) are written to a
temporary folder, file by file (a snapshot may lack large blobs), and checked as one run with every rule. Each case
then reads:

- a real bug: ``found`` when its code is reported within 3 lines of ``source_line`` (in the same cell for a
  notebook, whose ``source_line`` reads ``cell N, line M``), else ``MISSED``;
- a look-alike: ``FLAGGED`` when it is, else ``quiet``;
- a latent case: ``reported`` or ``not reported`` (counts neither way).

At HEAD the lines may have moved since the commit the case was read at: a miss there is worth a look, not a verdict.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from trainwise.doctor.engine import Config, check_paths
from trainwise.doctor.rule import Finding

SHAPES = Path(__file__).parent / "shapes"
NEAR = 3  # lines between a finding and the case's line that still count as the same place
CELL_LINE = re.compile(r"cell (\d+), line (\d+)")
PROJECT_FILES = re.compile(r"(?:^|/)(?:pyproject\.toml|setup\.cfg|requirements[\w.-]*\.txt)$")


def git_dir(mirror: Path, repository: str) -> Path | None:
    """The snapshot's git directory, matching ``owner+name`` without regard to case; None when not fetched."""
    wanted = repository.replace("/", "+").lower()
    for entry in mirror.iterdir() if mirror.is_dir() else ():
        if entry.name.lower() == wanted:
            repo = entry / "repo"
            if (repo / ".git").is_dir():
                return repo / ".git"
            return repo if repo.is_dir() else None
    return None


def git(directory: Path, *args: str, data: bytes | None = None) -> bytes:
    return subprocess.run(["git", f"--git-dir={directory}", *args], input=data, capture_output=True,
                          check=True).stdout


def revision(directory: Path, commit: str, head: bool) -> str:
    """The commit the cases were read at when the snapshot has it (and ``--head`` is not given), else HEAD."""
    if not head:
        probe = subprocess.run(["git", f"--git-dir={directory}", "cat-file", "-e", f"{commit}^{{commit}}"],
                               capture_output=True)
        if probe.returncode == 0:
            return commit
    return "HEAD"


def write_tree(directory: Path, rev: str, out: Path) -> int:
    """Write the Python files, notebooks and project files of ``rev`` under ``out``; how many were written."""
    wanted: dict[str, str] = {}
    for entry in git(directory, "ls-tree", "-r", "-z", rev).split(b"\0"):
        if not entry:
            continue
        meta, _, name = entry.decode("utf-8", errors="surrogateescape").partition("\t")
        _mode, kind, sha = meta.split()
        if kind == "blob" and (name.endswith((".py", ".ipynb")) or PROJECT_FILES.search(name)):
            wanted[name] = sha
    if not wanted:
        return 0
    # One `git cat-file --batch` for all blobs: each answer is "<sha> blob <size>\n<bytes>\n" or "<sha> missing\n".
    stream = git(directory, "cat-file", "--batch", data="".join(f"{sha}\n" for sha in wanted.values()).encode())
    written, position = 0, 0
    for name in wanted:
        header_end = stream.index(b"\n", position)
        header = stream[position:header_end].split()
        position = header_end + 1
        if len(header) < 3 or header[1] != b"blob":
            continue  # a blob the snapshot lacks
        size = int(header[2])
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(stream[position:position + size])
        position += size + 1
        written += 1
    return written


def reported_near(findings: list[Finding], case: dict) -> bool:
    """Whether the case's code is reported at its place (``source_line`` within NEAR lines, same cell)."""
    where = case["source_line"]
    cell = None
    if isinstance(where, str):
        match = CELL_LINE.search(where)
        if match is None:
            return any(f.code == case["code"] for f in findings)
        cell, where = int(match.group(1)), int(match.group(2))
    return any(f.code == case["code"] and f.cell == cell and abs(f.line - where) <= NEAR for f in findings)


VERDICTS = {"finding": ("found", "MISSED"), "lookalike": ("FLAGGED", "quiet"), "latent": ("reported", "not reported")}


def check_repository(mirror: Path, data: dict, head: bool, totals: Counter) -> None:
    """Check one SOURCE.json's cases on its repository; print a line per case and add to ``totals``."""
    repository, cases = data["repository"], data["cases"]
    directory = git_dir(mirror, repository)
    if directory is None:
        print(f"== {repository}: not fetched ({len(cases)} cases unchecked)")
        totals["unchecked"] += len(cases)
        return
    rev = revision(directory, data["commit"], head)
    with tempfile.TemporaryDirectory(prefix="public-sources-") as temporary:
        root = Path(temporary) / repository.replace("/", "+")
        root.mkdir()
        count = write_tree(directory, rev, root)
        print(f"== {repository} at {'HEAD' if rev == 'HEAD' else rev[:12]}: {count} files")
        results = check_paths([str(root)], Config(select=("ALL",)))
        by_path: dict[str, list[Finding]] = {}
        for result in results:
            by_path.setdefault(Path(result.path).resolve().relative_to(root.resolve()).as_posix(), []).extend(
                result.findings)
        for case in cases:
            where = f"{case['path']}:{case['source_line']} {case['code']} ({case['kind']})"
            if not (root / case["path"]).is_file():
                print(f"   absent       {where}")
                totals["unchecked"] += 1
                continue
            hit = reported_near(by_path.get(case["path"], []), case)
            verdict = VERDICTS[case["kind"]][0 if hit else 1]
            print(f"   {verdict:<12} {where}")
            totals[f"{case['kind']} checked"] += 1
            totals[f"{case['kind']} reported"] += hit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mirror", type=Path, help="folder of owner+name/repo git snapshots")
    parser.add_argument("slugs", nargs="*", help="shape folders to check (default: all)")
    parser.add_argument("--head", action="store_true", help="check HEAD even where the snapshot has the commit")
    args = parser.parse_args(argv)
    folders = sorted(p.parent for p in SHAPES.glob("*/SOURCE.json") if not args.slugs or p.parent.name in args.slugs)
    totals: Counter = Counter()
    for folder in folders:
        check_repository(args.mirror, json.loads((folder / "SOURCE.json").read_text(encoding="utf-8")), args.head,
                         totals)
    print(f"real bugs found {totals['finding reported']}/{totals['finding checked']}; "
          f"look-alikes flagged {totals['lookalike reported']}/{totals['lookalike checked']}; "
          f"latent reported {totals['latent reported']}/{totals['latent checked']}; "
          f"cases unchecked (not fetched, or file absent) {totals['unchecked']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
