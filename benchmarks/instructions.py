"""CPU instructions per training step, counted by callgrind: the guard (or nothing) around the minimal loop.

Timings on a shared machine move by 10-20% from run to run, and a step's time depends on caches the
instruction count does not see; the count itself does not move. Each side is one process under
``valgrind --tool=callgrind`` that builds the small MLP of ``overhead.py`` (32-64-10, batch 64, AdamW, fixed
batches, one thread), trains 64 steps outside any measurement (warm-up; the guard's first checks and samples),
then trains ``--steps`` more inside a C ``qsort`` callback: ``--collect-atstart=no --toggle-collect=qsort_r``
counts those steps alone, interpreter start-up and imports excluded. Steps 64-127 hold what a guard does on
some steps only (a check at step 100, TW102's samples at 64 and 96, TW105's pairs), so the per-step figure
is an average over them.

    python benchmarks/instructions.py                     # minimal and guard, 64 steps (~3 min on 2 cores)
    python benchmarks/instructions.py --sides minimal,guard,guard-every-8 --json

Needs valgrind (``apt install valgrind``). Nothing here asserts a count.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

SIDES = ("minimal", "guard", "guard-every-8")
WARMUP = 64


def child(side: str, steps: int) -> None:
    """The measured process: warm-up steps, then ``steps`` steps inside a qsort comparison callback."""
    import ctypes

    import torch
    import torch.nn.functional as F

    import trainwise

    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(64, 32, generator=generator), torch.randint(0, 10, (64,), generator=generator))
               for _ in range(16)]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

    def step(i: int) -> None:
        x, y = batches[i % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        loss.item()

    guard = None
    if side != "minimal":
        guard = trainwise.guard(model, optimizer, check_every=50, forward_every=8 if side == "guard-every-8" else 1)
    for i in range(WARMUP):
        step(i)

    def compare(a: int, b: int) -> int:  # the one comparison of a two-element sort: the measured steps
        for i in range(steps):
            step(WARMUP + i)
        return 0

    callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(compare)
    items = (ctypes.c_int * 2)(1, 2)
    ctypes.CDLL(None).qsort(items, 2, ctypes.sizeof(ctypes.c_int), callback)
    if guard is not None:
        guard.close()


def measure(side: str, steps: int, folder: str) -> int:
    """Instructions counted inside the measured steps of one side (one valgrind process)."""
    out = os.path.join(folder, f"{side}.callgrind")
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=qsort_r",
         f"--callgrind-out-file={out}", sys.executable, os.path.abspath(__file__), "--child", side,
         "--steps", str(steps)],
        capture_output=True, text=True, check=False)
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or found is None:
        raise SystemExit(f"the {side} side failed under valgrind ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return int(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sides", default="minimal,guard", help=f"comma-separated, minimal first ({','.join(SIDES)})")
    parser.add_argument("--steps", type=int, default=64, help="measured optimizer steps (after 64 warm-up steps)")
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps)
        return 0
    sides = args.sides.split(",")
    if sides[0] != "minimal" or any(side not in SIDES for side in sides) or args.steps < 1:
        raise SystemExit(f"--sides must start with minimal and name only {', '.join(SIDES)}; --steps must be positive.")
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed; install it (apt install valgrind) to count instructions.")
    with tempfile.TemporaryDirectory() as folder, ThreadPoolExecutor(max_workers=2) as pool:
        counts = dict(zip(sides, pool.map(lambda side: measure(side, args.steps, folder), sides), strict=True))
    per_step = {side: count / args.steps for side, count in counts.items()}
    base = per_step["minimal"]
    if args.json:
        print(json.dumps({"steps": args.steps, "per_step": per_step}))
        return 0
    print(f"CPU instructions per optimizer step, small MLP, steps {WARMUP}-{WARMUP + args.steps - 1} (callgrind)")
    for side, value in per_step.items():
        added = value - base
        print(f"  {side:14s} {value:12,.0f}  {added:+10,.0f}  ({added / base:+.2%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
