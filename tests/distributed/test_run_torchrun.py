"""``trainwise run`` under torchrun: every rank guarded, one report on rank 0 with the ranks that saw each finding
(two CPU processes, gloo), the script's collectives and output unchanged."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "cli" / "run_scripts" / "ddp_mistakes.py"


@pytest.mark.slow
def test_every_rank_is_guarded_and_rank_0_reports_the_ranks_of_each_finding(tmp_path):
    shutil.copy(SCRIPT, tmp_path / "train.py")
    lines = {m.group(1): n for n, text in enumerate(SCRIPT.read_text().splitlines(), start=1)
             if (m := re.search(r"# (TW\d{3})$", text))}
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}  # where the ranks leave their findings for rank 0
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "trainwise", "run", "--format", "json", "--output", "report.json", "train.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["rank 0 done", "rank 1 done"]
    report = json.loads((tmp_path / "report.json").read_text())
    assert {(e["code"], e["run_line"], tuple(e["ranks"])) for e in report} == {
        ("TW105", lines["TW105"], (0, 1)), ("TW103", lines["TW103"], (1,))}
    assert proc.stderr.count("trainwise run: doctor:") == 1  # the doctor ran once, on rank 0
    assert proc.stderr.count(f"train.py:{lines['TW105']}: TW105") == 1  # said once, not once per rank
    assert not [p for p in temp.iterdir() if p.name.startswith("trainwise-run-")]  # the ranks' files: gone
