"""Where a short ``fit`` spends its time besides the steps: set-up, epoch-end checkpoints, the rest of each epoch
end (log, diagnosis, early stopping), and the end of the run (learning curves, trackers, the last checkpoint
write), as shares of the whole ``fit``.

It runs ``benchmarks/overhead.py``'s small MLP (64 steps an epoch, about 1 ms a step on CPU) through the Trainer
with its defaults several times in this process (the first run pays the imports and is left out) and times the
Trainer's own phases with the main thread's CPU clock and the wall clock (``time.thread_time`` and
``time.perf_counter``; the checkpoint's fsync and pruning run on a background thread, which the CPU clock of the
main thread leaves out and the wall clock does not). The target of issue 14: epoch-end work (checkpoint, plot,
diagnosis) at most 5% of a short job's whole fit.

    python benchmarks/epoch_end.py                 # 10 epochs, 5 timed runs
    python benchmarks/epoch_end.py --epochs 3 --runs 3 --json

It wraps private Trainer and run methods to time them: the phases are this version's, not an API.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import overhead  # the small MLP, its data and the Trainer side

# phase: (where it lives, its name there): the Trainer's loop, and the run it builds and ends (trainwise.run)
PHASES = {"start": ("trainer", "start_run"), "train_epoch": ("Trainer", "_train_epoch"),
          "checkpoint": ("Fit", "checkpoint"), "epoch": ("Trainer", "_epoch"), "finish": ("Fit", "finish"),
          "fit": ("Trainer", "fit")}


def _timed_runs(epochs: int, runs: int, clock: Any) -> list[dict[str, float]]:
    from trainwise import run as run_module
    from trainwise import trainer as trainer_module

    spent: collections.defaultdict[str, float] = collections.defaultdict(float)
    owners = {"trainer": trainer_module, "Trainer": trainer_module.Trainer, "Fit": run_module.Fit}
    originals = {phase: (owners[owner], name, getattr(owners[owner], name)) for phase, (owner, name) in PHASES.items()}

    def timed(phase: str, original: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = clock()
            try:
                return original(*args, **kwargs)
            finally:
                spent[phase] += clock() - started

        return wrapper

    for phase, (owner, name, original) in originals.items():
        setattr(owner, name, timed(phase, original))
    dataset = overhead._data("small", 0)
    results = []
    try:
        for index in range(runs + 1):  # the first run pays the imports and first calls: not reported
            spent.clear()
            with tempfile.TemporaryDirectory() as folder, contextlib.redirect_stdout(io.StringIO()):
                options = overhead.RunOptions(epochs=epochs, batch_size=64, seed=0, log_every=50, folder=folder)
                overhead.run_trainer(overhead._model("small", 0), dataset, options, overhead.Stopwatch())
            if index:
                s = dict(spent)
                results.append({
                    "fit": s["fit"],
                    "set-up": s["start"],
                    "steps (train epochs)": s["train_epoch"],
                    "epoch-end checkpoints": s["checkpoint"],
                    "rest of the epoch ends": s["epoch"] - s["train_epoch"] - s["checkpoint"],
                    "end of the run (curves, trackers, last write)": s["finish"],
                })
    finally:
        for owner, name, original in originals.values():
            setattr(owner, name, original)
    return results


def measure(epochs: int, runs: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    report: dict[str, Any] = {"epochs": epochs, "runs": runs, "clocks": {}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, clock in (("main-thread cpu", time.thread_time), ("wall", time.perf_counter)):
            rows = _timed_runs(epochs, runs, clock)
            report["clocks"][name] = {
                phase: {
                    "ms": statistics.median(row[phase] for row in rows) * 1e3,
                    "share": statistics.median(row[phase] / row["fit"] for row in rows),
                }
                for phase in rows[0]
            }
            shares = [
                (row["epoch-end checkpoints"] + row["rest of the epoch ends"]
                 + row["end of the run (curves, trackers, last write)"]) / row["fit"]
                for row in rows
            ]
            report["clocks"][name]["epoch-end work"] = {
                "share": statistics.median(shares), "min": min(shares), "max": max(shares),
            }
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=10, help="epochs per fit (10)")
    parser.add_argument("--runs", type=int, default=5, help="timed fits per clock, after one untimed (5)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.runs < 1:
        parser.error("--epochs and --runs must be at least 1")
    report = measure(args.epochs, args.runs)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"Trainer defaults, small MLP, {args.epochs} epochs of 64 steps; median of {args.runs} fits in one "
          "process\n")
    for clock, phases in report["clocks"].items():
        print(f"{clock}:")
        for phase, figures in phases.items():
            if phase == "epoch-end work":
                continue
            print(f"  {phase:<48} {figures['ms']:8.1f} ms  {figures['share'] * 100:5.1f}%")
        work = phases["epoch-end work"]
        print(f"  epoch-end work (checkpoints, epoch ends, end of the run): {work['share'] * 100:.1f}% of the fit "
              f"[{work['min'] * 100:.1f}-{work['max'] * 100:.1f}] (target: at most 5%)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
