"""What ``trainwise run train.py`` costs against ``python train.py``: the same small script, whole process.

The script is the loop a user would write (an MLP 64-256-256-10 on synthetic data, batch 64, AdamW, per step
``zero_grad``, forward, ``F.cross_entropy``, ``backward``, ``step``, ``loss.item()``), written to a temporary
folder; it prints the wall and CPU time of its own training loop (after one warm-up step; one torch thread).
Four sides run it, each a fresh process, interleaved in a random order within each round:

- ``python``: ``python train.py``;
- ``run``: ``python -m trainwise run train.py`` (the doctor reads the script first, the guards watch every step);
- ``run-no-doctor``: ``python -m trainwise run --no-doctor train.py`` (the guards alone);
- ``run-no-checks``: ``python -m trainwise run --no-doctor --ignore TW train.py``: the global hooks find the model
  and optimizer and attach a guard with no check, so this side is the cost of ``trainwise run`` itself (start-up,
  the hooks on every module call and step) without the checks' own (``benchmarks/overhead.py`` measures those).

For each side: the whole process (wall clock, and the CPU time of the child, steadier when other processes share
the cores) and the script's own loop time; the medians with their spread (min-max), and against ``python`` the
ratio of the medians and the median and range of the per-round paired ratios. Every side must print the same
final loss (the guards change no number); the script fails otherwise.

    python benchmarks/run_overhead.py                    # 7 rounds, 300 steps
    python benchmarks/run_overhead.py --repeats 11 --steps 1000 --json
    python benchmarks/run_overhead.py --layers 24      # 73 small modules: the global hooks on every call

Nothing here asserts a time: the numbers mean something only as ratios within one run, on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = '''\
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

torch.set_num_threads(1)  # one thread: steadier when other processes share the cores
torch.manual_seed(0)
steps, layers = int(sys.argv[1]), int(sys.argv[2])
if layers:  # many small modules: what torch's global hooks cost on every module call shows
    blocks = [m for _ in range(layers) for m in (nn.Linear(64, 64), nn.LayerNorm(64), nn.GELU())]
    model = nn.Sequential(*blocks, nn.Linear(64, 10))
else:
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(steps + 1, 64, 64), torch.randint(0, 10, (steps + 1, 64))


def train_step(i):
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x[i]), y[i])
    loss.backward()
    optimizer.step()
    return loss.item()


train_step(0)  # warm-up: first-call costs
start, cpu = time.perf_counter(), time.process_time()
for i in range(1, steps + 1):
    last = train_step(i)
print(f"loop_s={time.perf_counter() - start:.6f} loop_cpu_s={time.process_time() - cpu:.6f} loss={last:.6f}")
'''

SIDES = {
    "python": [sys.executable, "train.py"],
    "run": [sys.executable, "-m", "trainwise", "run", "train.py"],
    "run-no-doctor": [sys.executable, "-m", "trainwise", "run", "--no-doctor", "train.py"],
    "run-no-checks": [sys.executable, "-m", "trainwise", "run", "--no-doctor", "--ignore", "TW", "train.py"],
}


def measure(command: list[str], cwd: str, steps: int, layers: int = 0) -> dict[str, float | str]:
    """One fresh process: wall time, the child's CPU time, the script's loop time and last loss."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([*command, str(steps), str(layers)], cwd=cwd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stderr}")
    fields = dict(part.split("=") for part in proc.stdout.split())
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "loop_s": float(fields["loop_s"]),
            "loop_cpu_s": float(fields["loop_cpu_s"]), "loss": fields["loss"],
            "stderr_lines": len(proc.stderr.splitlines())}


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="rounds (each side once per round)")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps of the script")
    parser.add_argument("--layers", type=int, default=0,
                        help="a model of this many Linear-LayerNorm-GELU blocks instead of the 3-layer MLP")
    parser.add_argument("--seed", type=int, default=0, help="seed of the order of the sides within rounds")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    order = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "train.py").write_text(SCRIPT)
        env_note = {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        for side in SIDES:  # one untimed run each: the file caches warm for every side alike
            measure(SIDES[side], folder, 5, args.layers)
        rounds: list[dict[str, dict]] = []
        for _ in range(args.repeats):
            sides = list(SIDES)
            order.shuffle(sides)
            rounds.append({side: measure(SIDES[side], folder, args.steps, args.layers) for side in sides})
    losses = {side: {r[side]["loss"] for r in rounds} for side in SIDES}
    if len(set().union(*losses.values())) != 1:
        raise SystemExit(f"the sides ended with different losses: {losses}")
    results: dict[str, dict] = {"steps": args.steps, "repeats": args.repeats, "env": env_note, "sides": {}}
    for side in SIDES:
        entry: dict[str, dict] = {}
        for clock in ("wall_s", "cpu_s", "loop_s", "loop_cpu_s"):
            values = [r[side][clock] for r in rounds]
            base = [r["python"][clock] for r in rounds]
            entry[clock] = summary(values)
            entry[clock]["ratio_of_medians"] = statistics.median(values) / statistics.median(base)
            entry[clock]["paired_ratio"] = summary([v / b for v, b in zip(values, base)])
        results["sides"][side] = entry
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{args.repeats} rounds, {args.steps} steps; median (min-max); ratio to python: of the medians, "
          f"paired median (min-max)")
    for clock, name in (("wall_s", "whole process, wall"), ("cpu_s", "whole process, CPU"),
                        ("loop_s", "the script's loop, wall"), ("loop_cpu_s", "the script's loop, CPU")):
        print(f"{name}:")
        for side, entry in results["sides"].items():
            s = entry[clock]
            p = s["paired_ratio"]
            print(f"  {side:14} {s['median']:8.3f} s ({s['min']:.3f}-{s['max']:.3f})  x{s['ratio_of_medians']:.3f}  "
                  f"paired x{p['median']:.3f} ({p['min']:.3f}-{p['max']:.3f})")


if __name__ == "__main__":
    main()
