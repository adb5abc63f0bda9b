"""CPU instructions per training step, counted by callgrind: the guard around the minimal loop, and the Trainer
against the minimal loop with the user's own optimizer.

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
    python benchmarks/instructions.py --sides minimal-adam,trainer-adam,trainer-adam-off   # ~6 min

The Trainer sides are ``overhead.py``'s (its data, sampler and ``RunOptions``; the user's ``torch.optim.Adam``):
each is counted twice, a whole 2-epoch run over ``--batches`` batches and over three times as many, each after
two warm-up runs in the same process; the difference over the added steps is the work per optimizer step
(loader, step, metrics, the guards' per-step work; nothing done once per epoch or run, and no log interval or
periodic check, which ``log_every=50`` puts past these runs' 48 steps), and what is left of the smaller run is
the set-up and epoch ends (``fixed``: checkpoints, the plot, the diagnosis, the run folder).

``--cache-sim`` runs callgrind's cache simulation (a first-level instruction and data cache and a last-level
cache of this machine's sizes) and counts estimated cycles instead, ``Ir + 10 x first-level misses + 100 x
last-level misses`` (valgrind's cycle estimate without branch simulation): code a step runs rarely (cold in
the cache) then costs more than its instructions; about twice as slow.

    python benchmarks/instructions.py --sides minimal-adam,trainer-adam --cache-sim

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
RUN_SIDES = ("minimal-adam", "trainer-adam", "trainer-adam-off")  # whole runs of overhead.py's sides
WARMUP = 64
EPOCHS = 2  # of each counted whole run
L1_MISSES = ("I1mr", "D1mr", "D1mw")  # callgrind's cache-simulation events
LL_MISSES = ("ILmr", "DLmr", "DLmw")


def run_child(side: str, batches: int) -> None:
    """The measured process of a run side: two warm-up runs, then one whole run inside a qsort callback."""
    import contextlib
    import ctypes
    import io
    import tempfile

    import torch
    from torch.utils.data import Subset

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import overhead

    torch.set_num_threads(1)
    _, _, _, _, batch_size, _ = overhead.SIZES["small"]
    dataset = overhead._data("small", 0)
    if batches * batch_size > len(dataset):
        raise SystemExit(f"--batches must be at most {len(dataset) // batch_size}.")

    def run(folder: str, data: object, epochs: int) -> None:
        options = overhead.RunOptions(epochs=epochs, batch_size=batch_size, seed=0, log_every=50, folder=folder)
        overhead.RUNNERS[side](overhead._model("small", 0), data, options, overhead.Stopwatch())

    with tempfile.TemporaryDirectory() as folder, contextlib.redirect_stdout(io.StringIO()):
        for warmup in ("a", "b"):  # imports, first calls, a second run folder
            run(os.path.join(folder, warmup), Subset(dataset, range(8 * batch_size)), 1)
        data = Subset(dataset, range(batches * batch_size))

        def compare(a: int, b: int) -> int:  # the one comparison of a two-element sort: the counted run
            run(os.path.join(folder, "counted"), data, EPOCHS)
            return 0

        callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(compare)
        items = (ctypes.c_int * 2)(1, 2)
        ctypes.CDLL(None).qsort(items, 2, ctypes.sizeof(ctypes.c_int), callback)


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


def measure(side: str, steps: int, folder: str, *, batches: int | None = None, cache_sim: bool = False) -> int:
    """Instructions (or, with ``cache_sim``, estimated cycles) counted inside the measured steps of one side (one
    valgrind process); a run side counts its whole run over ``batches`` batches."""
    size = ["--steps", str(steps)] if batches is None else ["--batches", str(batches)]
    out = os.path.join(folder, f"{side}-{batches}.callgrind")
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=qsort_r",
         f"--cache-sim={'yes' if cache_sim else 'no'}", f"--callgrind-out-file={out}", sys.executable,
         os.path.abspath(__file__), "--child", side, *size],
        capture_output=True, text=True, check=False, env=dict(os.environ, OMP_NUM_THREADS="1"))
    events = collected_events(proc.stderr)
    if proc.returncode != 0 or events is None:
        raise SystemExit(f"the {side} side failed under valgrind ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return estimated_cycles(events) if cache_sim else events["Ir"]


def collected_events(report: str) -> dict[str, int] | None:
    """callgrind's ``Events : Ir ...`` and ``Collected : 123 ...`` lines (its stderr) as a dict, or None."""
    names = re.search(r"Events *: *([A-Za-z0-9 ]+)", report)
    values = re.search(r"Collected *: *([0-9 ]+)", report)
    if names is None or values is None or len(names.group(1).split()) != len(values.group(1).split()):
        return None
    return dict(zip(names.group(1).split(), map(int, values.group(1).split()), strict=True))


def estimated_cycles(events: dict[str, int]) -> int:
    """Ir + 10 x first-level cache misses + 100 x last-level misses (needs callgrind's cache simulation)."""
    missing = [name for name in ("Ir", *L1_MISSES, *LL_MISSES) if name not in events]
    if missing:
        raise SystemExit(f"callgrind reported no {', '.join(missing)}; run it with --cache-sim=yes.")
    return events["Ir"] + 10 * sum(events[name] for name in L1_MISSES) + 100 * sum(events[name] for name in LL_MISSES)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sides", default="minimal,guard", help=f"comma-separated, minimal first ({','.join(SIDES)})")
    parser.add_argument("--steps", type=int, default=64, help="measured optimizer steps (after 64 warm-up steps)")
    parser.add_argument("--batches", type=int, default=8,
                        help="batches of the smaller counted run of a Trainer side (the larger: three times as many)")
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    parser.add_argument("--cache-sim", action="store_true",
                        help="count estimated cycles (callgrind's cache simulation) instead of instructions")
    parser.add_argument("--child", choices=SIDES + RUN_SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child in RUN_SIDES:
        run_child(args.child, args.batches)
        return 0
    if args.child:
        child(args.child, args.steps)
        return 0
    sides = args.sides.split(",")
    if sides[0] == RUN_SIDES[0]:
        if any(side not in RUN_SIDES for side in sides) or not 2 <= args.batches <= 21:
            raise SystemExit(f"--sides that start with {RUN_SIDES[0]} name only {', '.join(RUN_SIDES)}; "
                             "--batches must be 2 to 21.")
    elif sides[0] != "minimal" or any(side not in SIDES for side in sides) or args.steps < 1:
        raise SystemExit(f"--sides must start with minimal and name only {', '.join(SIDES)}, or start with "
                         f"{RUN_SIDES[0]} and name only {', '.join(RUN_SIDES)}; --steps must be positive.")
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed; install it (apt install valgrind) to count instructions.")
    if sides[0] == RUN_SIDES[0]:
        return report_runs(sides, args.batches, as_json=args.json, cache_sim=args.cache_sim)
    with tempfile.TemporaryDirectory() as folder, ThreadPoolExecutor(max_workers=2) as pool:
        counts = dict(zip(sides, pool.map(lambda side: measure(side, args.steps, folder, cache_sim=args.cache_sim),
                                          sides), strict=True))
    per_step = {side: count / args.steps for side, count in counts.items()}
    base = per_step["minimal"]
    if args.json:
        print(json.dumps({"steps": args.steps, "counted": _counted(args.cache_sim), "per_step": per_step}))
        return 0
    print(f"CPU {_counted(args.cache_sim).replace('_', ' ')} per optimizer step, small MLP, steps {WARMUP}-"
          f"{WARMUP + args.steps - 1} (callgrind)")
    for side, value in per_step.items():
        added = value - base
        print(f"  {side:14s} {value:12,.0f}  {added:+10,.0f}  ({added / base:+.2%})")
    return 0


def _counted(cache_sim: bool) -> str:
    return "estimated_cycles" if cache_sim else "instructions"


def report_runs(sides: list[str], batches: int, *, as_json: bool, cache_sim: bool = False) -> int:
    """The Trainer sides: per step from the difference of two run lengths, the rest as fixed work."""
    jobs = [(side, n) for side in sides for n in (batches, 3 * batches)]
    with tempfile.TemporaryDirectory() as folder, ThreadPoolExecutor(max_workers=2) as pool:
        counts = dict(zip(jobs, pool.map(lambda job: measure(job[0], 0, folder, batches=job[1], cache_sim=cache_sim),
                                         jobs), strict=True))
    added_steps = 2 * batches * EPOCHS
    figures = {}
    for side in sides:
        per_step = (counts[(side, 3 * batches)] - counts[(side, batches)]) / added_steps
        figures[side] = {"per_step": per_step, "fixed": counts[(side, batches)] - per_step * batches * EPOCHS}
    if as_json:
        print(json.dumps({"epochs": EPOCHS, "batches": [batches, 3 * batches], "counted": _counted(cache_sim),
                          "sides": figures}))
        return 0
    base = figures[sides[0]]
    print(f"CPU {_counted(cache_sim).replace('_', ' ')}, small MLP, user's Adam, {EPOCHS}-epoch runs of {batches} "
          f"and {3 * batches} batches (callgrind)")
    print(f"  {'side':18s} {'per step':>12s} {'added':>10s} {'':>9s} {'set-up and epoch ends':>22s} {'added':>12s}")
    for side, figure in figures.items():
        added, fixed = figure["per_step"] - base["per_step"], figure["fixed"] - base["fixed"]
        print(f"  {side:18s} {figure['per_step']:12,.0f} {added:+10,.0f} ({added / base['per_step']:+.2%}) "
              f"{figure['fixed']:22,.0f} {fixed:+12,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
