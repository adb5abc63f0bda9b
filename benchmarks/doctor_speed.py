"""``trainwise doctor`` against TorchFix on the same files, in one run: files/s, lines/s and the ratio.

    .venv/bin/python benchmarks/doctor_speed.py                  # torch's nn, optim, utils/data (default)
    .venv/bin/python benchmarks/doctor_speed.py --repeats 5 PATH [PATH ...]
    .venv/bin/python benchmarks/doctor_speed.py --json           # one JSON summary as the last line

Each measurement is a fresh process (`python -m trainwise.cli doctor ...`, `python -m torchfix ...`) timed
from outside, so interpreter start-up and imports count, as they do for a user; the two tools alternate
(doctor, torchfix, doctor, ...) and the report gives medians and ranges. TorchFix runs with `--jobs 1`, like
the doctor, so the figures compare work per core; `--torchfix-jobs N` gives it more. A small-file row
times both tools on one short script (what a pre-commit hook on one changed file pays). Needs the `bench`
extra (`pip install 'trainwise[bench]'`) for TorchFix; without it only the doctor is measured.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SMALL = """\
import torch
from torch.utils.data import DataLoader

loader = DataLoader(dataset, batch_size=32)
correct = 0
for x, y in loader:
    correct += (model(x).argmax(1) == y).sum().item()
print(correct / len(loader))
state = torch.load("model.pt")
"""


def default_paths() -> list[str]:
    """torch/nn, torch/optim and torch/utils/data of the installed torch, found without importing it."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torch is not installed: pass the paths to measure")
    root = Path(next(iter(spec.submodule_search_locations)))
    return [str(root / "nn"), str(root / "optim"), str(root / "utils" / "data")]


def count(paths: list[str]) -> tuple[int, int]:
    """Python files and lines under ``paths`` (what both tools read)."""
    files = lines = 0
    for raw in paths:
        path = Path(raw)
        candidates = [path] if path.is_file() else sorted(path.rglob("*.py"))
        for file in candidates:
            if any(part in ("__pycache__", "site-packages", ".venv", "build") for part in file.parts[len(path.parts):]):
                continue
            files += 1
            with open(file, "rb") as fh:
                lines += fh.read().count(b"\n")
    return files, lines


def timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    elapsed = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}):\n{proc.stderr.decode()[-2000:]}")
    return elapsed


def measure(paths: list[str], repeats: int, torchfix_jobs: int, env: dict[str, str]) -> dict[str, list[float]]:
    doctor = [sys.executable, "-m", "trainwise.cli", "doctor", "--format", "json", *paths]
    torchfix = [sys.executable, "-m", "torchfix", "--jobs", str(torchfix_jobs), *paths]
    have_torchfix = importlib.util.find_spec("torchfix") is not None
    times: dict[str, list[float]] = {"doctor": []}
    if have_torchfix:
        times["torchfix"] = []
    timed(doctor, env)  # warm-up: bytecode caches, file system cache (TorchFix is slow enough without one)
    for _ in range(repeats):
        times["doctor"].append(timed(doctor, env))
        if have_torchfix:
            times["torchfix"].append(timed(torchfix, env))
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", help="files or folders (default: torch's nn, optim, utils/data)")
    parser.add_argument("--repeats", type=int, default=3, help="fresh-process runs per tool (default 3)")
    parser.add_argument("--torchfix-jobs", type=int, default=1, help="TorchFix --jobs (default 1)")
    parser.add_argument("--json", action="store_true", help="print one JSON summary as the last line")
    args = parser.parse_args(argv)
    paths = args.paths or default_paths()
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # like an installed package: bytecode cached after the first run
    files, lines = count(paths)
    print(f"tree: {files} files, {lines} lines ({', '.join(paths)})")
    print(f"load average before: {os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "")
    summary: dict[str, object] = {"files": files, "lines": lines}
    for label, target_paths in (("tree", paths), ("small file", None)):
        if target_paths is None:
            with tempfile.TemporaryDirectory() as tmp:
                small = Path(tmp) / "train.py"
                small.write_text(SMALL)
                times = measure([str(small)], args.repeats, 1, env)
        else:
            times = measure(target_paths, args.repeats, args.torchfix_jobs, env)
        medians = {tool: statistics.median(t) for tool, t in times.items()}
        print(f"\n{label}:")
        for tool, t in times.items():
            extra = f"  {files / medians[tool]:8.1f} files/s  {lines / medians[tool]:10.0f} lines/s" if (
                target_paths is not None) else ""
            print(f"  {tool:9} median {medians[tool]:7.3f} s  (min {min(t):.3f}, max {max(t):.3f}){extra}")
        if "torchfix" in medians:
            ratio = medians["torchfix"] / medians["doctor"]
            print(f"  doctor is {ratio:.1f}x faster than TorchFix")
        summary[label.replace(" ", "_")] = {"median_s": medians,
                                             "ratio": medians.get("torchfix", float("nan")) / medians["doctor"]}
    if hasattr(os, "getloadavg"):
        print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
