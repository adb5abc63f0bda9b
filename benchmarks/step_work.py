"""Work per training step, counted instead of timed: torch operations and Python function calls per optimizer step.

Timings on a shared machine move by 10-20% from one run to the next; counts do not. For each side of
``benchmarks/overhead.py`` (same model, data, optimizer and loop), this runs one epoch of the small MLP in this
process and counts, between the 8th and the 56th optimizer step of the epoch (so set-up, the first steps and
the epoch end are left out):

- the aten operations torch dispatches (each one a kernel launch, a few microseconds on CPU), with a
  ``TorchDispatchMode``, in one run;
- the Python function calls (``sys.setprofile`` "call" events: every frame, torch's own included), in a second
  run, since the dispatch mode itself changes which Python torch runs;
- the Python lines executed (``sys.settrace`` events: lines, calls and returns), in a third run: the closest
  count to the interpreter's share of the step (a call can be one line or a hundred), with the files they
  ran in.

Then per step: each side's counts and what it adds to ``minimal`` (the loop a user would write), with the
operations it adds by name. A side that adds no operation and a few dozen calls costs, on a ~1 ms step,
about the 1-2% a function call and a kernel launch cost there; `benchmarks/overhead.py` measures the time.

    python benchmarks/step_work.py                      # minimal, same-work, guard, trainer, trainer-off
    python benchmarks/step_work.py --sides minimal,trainer --json

The counts are exact for one torch and Python version; they change when torch's own code does.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import os
import sys
import tempfile
import warnings
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import overhead  # the sides, model and data of the timing benchmark

FIRST, LAST = 8, 56  # optimizer steps of the epoch between which the work is counted
DEFAULT_SIDES = "minimal,same-work,guard,trainer,trainer-off"


class _Window:
    """Counts while the optimizer-step count is in [FIRST, LAST)."""

    def __init__(self) -> None:
        self.steps = 0
        self.counting = False

    def __call__(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.steps += 1
        self.counting = FIRST <= self.steps < LAST


def _run_side(side: str, *, count: str) -> collections.Counter:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils._python_dispatch import TorchDispatchMode

    window = _Window()
    counts: collections.Counter = collections.Counter()

    class Operations(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if window.counting:
                counts[str(func.overloadpacket.__name__)] += 1
            return func(*args, **(kwargs or {}))

    def calls(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and window.counting:
            counts[f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}"] += 1

    def lines(frame: Any, event: str, arg: Any) -> Any:
        if window.counting:
            counts[os.path.basename(frame.f_code.co_filename)] += 1
        return lines

    _, _, _, _, batch_size, _ = overhead.SIZES["small"]
    dataset = overhead._data("small", 0)
    model = overhead._model("small", 0)
    handle = register_optimizer_step_post_hook(window)
    try:
        with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings(), \
                contextlib.redirect_stdout(io.StringIO()):  # the Trainer's progress lines
            warnings.simplefilter("ignore")
            options = overhead.RunOptions(epochs=1, batch_size=batch_size, seed=0, log_every=50, folder=folder)
            if count == "operations":
                with Operations():
                    overhead.RUNNERS[side](model, dataset, options, overhead.Stopwatch())
            else:
                install, tracer = (sys.settrace, lines) if count == "lines" else (sys.setprofile, calls)
                install(tracer)
                try:
                    overhead.RUNNERS[side](model, dataset, options, overhead.Stopwatch())
                finally:
                    install(None)
    finally:
        handle.remove()
    torch.set_num_threads(1)  # a side that changed it must not change the next one's counts
    return counts


def measure(sides: list[str]) -> dict[str, Any]:
    import torch

    threads = torch.get_num_threads()  # the counts run on one thread; the caller's count is put back after
    try:
        return _measure(sides)
    finally:
        torch.set_num_threads(threads)


def _measure(sides: list[str]) -> dict[str, Any]:
    steps = LAST - FIRST
    report: dict[str, Any] = {"steps_counted": steps, "sides": {}}
    for side in sides:
        operations = _run_side(side, count="operations")
        calls = _run_side(side, count="calls")
        calls = collections.Counter({k: v for k, v in calls.items() if not k.startswith("step_work.py:")})
        lines = _run_side(side, count="lines")
        lines.pop("step_work.py", None)
        report["sides"][side] = {
            "operations": sum(operations.values()) / steps,
            "calls": sum(calls.values()) / steps,
            "lines": sum(lines.values()) / steps,
            "by_operation": {k: v / steps for k, v in sorted(operations.items())},
            "lines_by_file": {k: v / steps for k, v in sorted(lines.items())},
        }
    base = report["sides"][overhead.BASELINE]
    for entry in report["sides"].values():
        entry["added_operations"] = entry["operations"] - base["operations"]
        entry["added_calls"] = entry["calls"] - base["calls"]
        entry["added_lines"] = entry["lines"] - base["lines"]
        entry["lines_added_by_file"] = dict(sorted(
            ((name, round(entry["lines_by_file"].get(name, 0) - base["lines_by_file"].get(name, 0), 1))
             for name in set(entry["lines_by_file"]) | set(base["lines_by_file"])),
            key=lambda item: -item[1])[:6])
        entry["operations_added_by_name"] = {
            name: round(entry["by_operation"].get(name, 0) - base["by_operation"].get(name, 0), 2)
            for name in sorted(set(entry["by_operation"]) | set(base["by_operation"]))
            if abs(entry["by_operation"].get(name, 0) - base["by_operation"].get(name, 0)) >= 0.01
        }
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sides", default=DEFAULT_SIDES, help=f"comma-separated, minimal first ({DEFAULT_SIDES})")
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    unknown = [s for s in sides if s not in overhead.RUNNERS]
    if unknown or overhead.BASELINE not in sides:
        parser.error(f"--sides must include {overhead.BASELINE} and only these: {', '.join(overhead.RUNNERS)}")
    missing = {side: why for side in sides if (why := overhead._missing(side))}
    sides = [s for s in sides if s not in missing]
    report = measure(sides)
    report["skipped"] = missing
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"Work per optimizer step, small MLP, counted over steps {FIRST}-{LAST} of one epoch (torch "
          f"{torch.__version__}, Python {sys.version.split()[0]})\n")
    print(f"{'side':<12} {'torch ops':>10} {'added':>7} {'Python calls':>13} {'added':>7} {'Python lines':>13} "
          f"{'added':>7}")
    for side, e in report["sides"].items():
        print(f"{side:<12} {e['operations']:>10.1f} {e['added_operations']:>+7.1f} {e['calls']:>13.1f} "
              f"{e['added_calls']:>+7.1f} {e['lines']:>13.1f} {e['added_lines']:>+7.1f}")
    print("\nwhat each side adds to the minimal loop per step:")
    for side, e in report["sides"].items():
        if side == overhead.BASELINE:
            continue
        ops = ", ".join(f"{name} {n:+g}" for name, n in e["operations_added_by_name"].items()) or "none"
        where = ", ".join(f"{name} {n:+g}" for name, n in e["lines_added_by_file"].items() if n > 0)
        print(f"  {side}: operations {ops}; lines mostly in {where}")
    for side, why in missing.items():
        print(f"skipped {side}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
