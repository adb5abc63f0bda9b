"""Set-up before the first step: how long each way of training takes from its first line to the end of its first
optimizer step, against the loop a user writes, in fresh processes.

Every side trains ``overhead.py``'s small MLP (32-64-10, batch 64, AdamW) on the same synthetic data:

- ``hand`` (the baseline): the loop a user writes: ``AdamW(model.parameters())``, a seeded ``DataLoader``,
  zero_grad, forward, ``F.cross_entropy``, backward, step;
- ``trainer``: ``Trainer(...).fit(model, data)`` with its defaults (run folder, checkpoints, guards, progress);
- ``trainer-off``: the same with everything optional off (``overhead.py``'s ``trainer-off``);
- ``fabric``, ``accelerate``: the hand loop through Lightning Fabric or Hugging Face Accelerate, when they import.

Each measurement is a fresh process. It imports torch and builds the data, pays torch's own one-time cost of a
first optimizer untimed (``torch.optim.Optimizer.__init__`` imports ``torch._dynamo``, and with it sympy, inductor
and FSDP: about a second, and the same for every side), then times the side's import (``from trainwise import
Trainer``, ``from lightning.fabric import Fabric``...), then from before the side's first line (the model built, the
Trainer, Fabric or Accelerator made) to the end of its first optimizer step, stamped by a global ``torch.optim``
step hook that stops the run there:

- ``first``: the side's first run in the process (first-call paths: modules a fit imports lazily, caches);
- ``again``: the median of ``--again`` more runs in the same process (what every later fit costs).

Both clocks: wall (what a user waits; it sees ``fsync`` and other waits) and process CPU time (steadier on a shared
machine). The parent runs the sides interleaved, in a random order each round, and reports each side's median and
spread (min-max) over the rounds, and its excess over ``hand`` paired per round (median and range). Whether
trainwise's modules came from cached bytecode or were compiled from source is reported: with
``PYTHONDONTWRITEBYTECODE=1`` and no ``__pycache__`` every process compiles them, which is part of its import.

    python benchmarks/first_step.py                  # 9 rounds (about 2 minutes on 2 cores)
    python benchmarks/first_step.py --repeats 15 --sides hand,trainer --json

Nothing here asserts a time: the numbers mean something only within one run, on one machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import overhead
import rounds

SIDES = ("hand", "trainer", "trainer-off", "fabric", "accelerate")
PEERS = {"fabric": "lightning.fabric", "accelerate": "accelerate"}
BASELINE = "hand"
TARGET_MS = 30.0  # the target for trainwise's set-up (first and later runs, per clock)
RESULT_MARK = "FIRST_STEP_RESULT "
CLOCKS = ("wall", "cpu")


class FirstStep(Exception):
    """Raised by the step hook: the run stops at the end of its first optimizer step."""


def _import(side: str) -> Any:
    """The side's entry point, imported as a user's script imports it."""
    if side.startswith("trainer"):
        from trainwise import Trainer

        return Trainer
    if side == "fabric":
        from lightning.fabric import Fabric

        return Fabric
    if side == "accelerate":
        from accelerate import Accelerator

        return Accelerator
    return None


def _run(side: str, entry: Any, dataset: Any, folder: str) -> None:
    """One run of ``side`` from its first line; the step hook raises :class:`FirstStep` after the first step."""
    import torch

    model = overhead._model("small", 0)
    options = overhead.RunOptions(epochs=1, batch_size=64, seed=0, log_every=50, folder=folder)
    if side.startswith("trainer"):
        off = {"progress": "off", "checkpoints": False, "plot": False, "diagnose": False, "guards": "off",
               "accuracy": "off"} if side == "trainer-off" else {}
        entry(epochs=1, lr=overhead.LR, weight_decay=overhead.WEIGHT_DECAY, batch_size=64, device="cpu",
              precision="fp32", seed=0, run_dir=os.path.join(folder, "run"), **off).fit(model, dataset)
        return
    optimizer = torch.optim.AdamW(model.parameters(), lr=overhead.LR, weight_decay=overhead.WEIGHT_DECAY)
    loader = overhead._loader(dataset, options)
    backward = overhead._plain_backward
    if side == "fabric":
        fabric = entry(accelerator="cpu", devices=1, precision="32-true")
        model, optimizer = fabric.setup(model, optimizer)
        loader, backward = fabric.setup_dataloaders(loader), fabric.backward
    elif side == "accelerate":
        accelerator = entry(cpu=True)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        backward = accelerator.backward
    overhead._minimal_loop(model, optimizer, loader, 1, backward)


def _bytecode() -> str:
    """Whether trainwise's modules were loaded from cached bytecode or compiled from source in this process."""
    module = sys.modules.get("trainwise.trainer")
    cached = getattr(getattr(module, "__spec__", None), "cached", None)
    if module is None:
        return "not imported"
    return "cached" if cached and os.path.exists(cached) else "compiled from source"


def child(side: str, again: int) -> dict[str, Any]:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    torch.set_num_threads(1)
    dataset = overhead._data("small", 0)
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])  # torch's one-time cost (imports torch._dynamo)
    stamp: dict[str, float] = {}

    def first_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        stamp.update(wall=time.perf_counter(), cpu=time.process_time())
        raise FirstStep

    register_optimizer_step_post_hook(first_step)
    wall, cpu = time.perf_counter(), time.process_time()
    entry = _import(side)
    imported = {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}
    runs = []
    with tempfile.TemporaryDirectory() as folder:
        for index in range(1 + again):
            wall, cpu = time.perf_counter(), time.process_time()
            with contextlib.suppress(FirstStep):
                _run(side, entry, dataset, os.path.join(folder, str(index)))
            if not stamp:
                raise SystemExit(f"{side} ended without an optimizer step")
            runs.append({"wall": stamp["wall"] - wall, "cpu": stamp["cpu"] - cpu})
            stamp.clear()
    return {"side": side, "import": imported, "first": runs[0],
            "again": {clock: statistics.median(r[clock] for r in runs[1:]) for clock in CLOCKS},
            "bytecode": _bytecode()}


def _spawn(side: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, os.path.abspath(__file__), "--child", side, "--again", str(args.again)]
    return rounds.child_result(command, threads=1, mark=RESULT_MARK, label=side)


def _sides(requested: str | None) -> tuple[list[str], dict[str, str]]:
    """The sides to run and the peers left out (side -> why)."""
    import importlib.util

    names = list(SIDES) if requested is None else [s.strip() for s in requested.split(",") if s.strip()]
    unknown = [name for name in names if name not in SIDES]
    if unknown or BASELINE not in names:
        raise SystemExit(f"--sides must include {BASELINE} and only these: {', '.join(SIDES)}.")
    skipped = {}
    for name in names:
        module = PEERS.get(name)
        if module is not None and importlib.util.find_spec(module.split(".")[0]) is None:
            skipped[name] = f"{module.split('.')[0]} is not installed ({overhead.INSTALL})"
    return [name for name in names if name not in skipped], skipped


def parent(args: argparse.Namespace) -> dict[str, Any]:
    sides, skipped = _sides(args.sides)
    runs, load, seconds = rounds.interleaved(sides, args.repeats, args.seed, lambda side: _spawn(side, args),
                                             quiet=args.json)
    report: dict[str, Any] = {"repeats": args.repeats, "again": args.again, "sides": sides, "skipped": skipped,
                              "load_average_1min": load, "seconds": seconds, "figures": {}}
    base = runs[BASELINE]
    for side, side_runs in runs.items():
        figures: dict[str, Any] = {"bytecode": sorted({r["bytecode"] for r in side_runs})}
        for figure in ("import", "first", "again"):
            figures[figure] = {clock: rounds.summary([r[figure][clock] for r in side_runs]) for clock in CLOCKS}
            if figure != "import" and side != BASELINE:
                figures[figure + "_excess"] = {
                    clock: rounds.summary([r[figure][clock] - b[figure][clock] for r, b in zip(side_runs, base)])
                    for clock in CLOCKS}
        report["figures"][side] = figures
    return report


def _ms(summary: dict[str, float]) -> str:
    return f"{summary['median'] * 1e3:.1f} [{summary['min'] * 1e3:.1f}-{summary['max'] * 1e3:.1f}]"


def _print(report: dict[str, Any]) -> None:
    load = report["load_average_1min"]
    print(f"\nSet-up to the end of the first optimizer step, small MLP; {report['repeats']} interleaved rounds of "
          f"fresh processes; 'again': median of {report['again']} later runs in each process")
    if load:
        print(f"load average (1 min) before/after: {load[0]:.2f}/{load[1]:.2f}; took {report['seconds']:.0f} s")
    for side, why in report["skipped"].items():
        print(f"skipped {side}: {why}")
    print("ms median [min-max] over rounds; excess: the side less hand, paired per round")
    print(f"{'side':<12} {'clock':<5} {'import':<20} {'first run':<20} {'excess':<22} {'again':<20} excess")
    for clock in CLOCKS:
        for side, f in report["figures"].items():
            first_excess = _ms(f["first_excess"][clock]) if "first_excess" in f else ""
            again_excess = _ms(f["again_excess"][clock]) if "again_excess" in f else ""
            print(f"{side:<12} {clock:<5} {_ms(f['import'][clock]):<20} {_ms(f['first'][clock]):<20} "
                  f"{first_excess:<22} {_ms(f['again'][clock]):<20} {again_excess}")
    for side, f in report["figures"].items():
        if side.startswith("trainer"):
            print(f"{side}: trainwise's modules {', '.join(f['bytecode'])}")
    print(f"target: trainwise's set-up (first run and later runs) <= {TARGET_MS:.0f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=9, help="interleaved rounds, a fresh process per side (9)")
    parser.add_argument("--again", type=int, default=5, help="later runs timed in each process, median kept (5)")
    parser.add_argument("--sides", default=None, help=f"comma-separated, {BASELINE} among them ({', '.join(SIDES)})")
    parser.add_argument("--seed", type=int, default=0, help="run-order seed (0)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.repeats, args.again) < 1:
        parser.error("--repeats and --again must be at least 1")
    if args.child:
        print(RESULT_MARK + json.dumps(child(args.child, args.again)), flush=True)
        return 0
    report = parent(args)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
