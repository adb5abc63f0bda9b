"""What each part of the Trainer costs per step and per run, timed in one process: the user's loop, then the same
loop with trainwise's pieces taken one at a time, the Trainer with everything optional off, and each option turned
on alone.

`benchmarks/overhead.py` times whole sides in fresh processes, whose spread on a shared machine is as large as
the differences; here every side runs in the same process, in a random order within each round, and each
round's ratio to the base side is taken, so slow phases of the machine hit both sides of a ratio. All sides
train the small MLP of `overhead.py` with the same `torch.optim.Adam` (the user's own optimizer: no fused
kernel on either side), on CPU, one thread; per step is the mean interval between optimizer steps inside each
epoch (process CPU time; epoch ends left out, so an option's epoch-end work shows only where it runs on a
thread during the next epoch, as the checkpoint commit does), and the whole run is the process CPU time of the
side's call (set-up, epoch ends and every thread included: where an option's epoch-end work, a checkpoint or
the plot, shows).

    python benchmarks/trainer_costs.py                       # 15 rounds of every side, about 2 minutes
    python benchmarks/trainer_costs.py --rounds 25 --json

Sides (each against ``minimal-adam``; the options also against ``trainer-off``):

- ``minimal-adam``: the loop a user writes (``overhead.py``'s minimal loop on ``Adam(model.parameters())``);
- ``loader``: that loop over ``tw.training_loader`` (seeded, resumable, the last batch known);
- ``primitives``: that loader with ``forward_micro_batch``, ``GradientAccumulator`` and ``MetricSet`` written
  out by hand, as ``examples/hand_written_loop.py`` does;
- ``train-step``: the same through one ``TrainStep`` (the Trainer's step object);
- ``trainer-off``: ``Trainer(optimizer=<the user's Adam>)`` with every option off;
- ``+guards``, ``+accuracy``, ``+progress``, ``+checkpoints``, ``+diagnose``, ``+plot``: one option on;
- ``trainer``: the Trainer's defaults with the user's Adam;
- ``probe:*``: the user's loop with a little work added after the loss that changes nothing (``probe:none`` adds
  an empty call; ``1-op``, one detach; ``accuracy-ops``, a hand-written accuracy; ``numpy-sum``, the targets
  summed by numpy; ``30-calls``, thirty calls of one small function). For each, what it adds to a step (its
  step less ``probe:none``'s, per round) beside what the same call costs alone, called over and over: work
  whose code the step runs anyway costs about what it costs alone; work whose code the step never runs (argmax,
  numpy) costs several times more inside a step than alone, and instructions counts (``instructions.py``) do
  not see that.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import overhead  # the model, data, loader and clocks of the timing benchmark

BASE = "minimal-adam"
OFF = {"progress": "off", "checkpoints": False, "plot": False, "diagnose": False, "guards": "off",
       "accuracy": "off"}
OPTIONS = {"guards": "warn", "accuracy": "auto", "progress": "auto", "checkpoints": True, "diagnose": True,
           "plot": True}


def _users_loop(model: Any, loader: Any, epochs: int) -> Any:
    import torch

    optimizer = torch.optim.Adam(model.parameters(), lr=overhead.LR)
    overhead._minimal_loop(model, optimizer, loader, epochs, overhead._plain_backward)
    return model


def run_minimal_adam(model: Any, dataset: Any, options: Any) -> Any:
    return _users_loop(model, overhead._loader(dataset, options), options.epochs)


def run_loader(model: Any, dataset: Any, options: Any) -> Any:
    import trainwise as tw

    loader = tw.training_loader(dataset, batch_size=options.batch_size, seed=options.seed)
    return _users_loop(model, loader, options.epochs)


def run_primitives(model: Any, dataset: Any, options: Any) -> Any:
    import torch

    import trainwise as tw

    optimizer = torch.optim.Adam(model.parameters(), lr=overhead.LR)
    loader = tw.training_loader(dataset, batch_size=options.batch_size, seed=options.seed)
    accumulator = tw.GradientAccumulator(optimizer, steps=1)
    metrics = tw.MetricSet("cpu")
    for _ in range(options.epochs):
        model.train()
        metrics.reset()
        for batch, _last in loader.with_last():
            micro = tw.forward_micro_batch(model, batch)
            accumulator.backward(micro.loss, count=micro.count, reduction=micro.reduction)
            metrics.mean("loss").update_loss(micro.loss.detach(), micro.count, micro.reduction)
            accumulator.step()
        metrics.compute()
    return model


def run_train_step(model: Any, dataset: Any, options: Any) -> Any:
    import torch

    import trainwise as tw
    from trainwise.step import TrainStep

    optimizer = torch.optim.Adam(model.parameters(), lr=overhead.LR)
    loader = tw.training_loader(dataset, batch_size=options.batch_size, seed=options.seed)
    metrics = tw.MetricSet("cpu")
    step = TrainStep(model, tw.GradientAccumulator(optimizer, steps=1), tw.forward_micro_batch, metrics,
                     accuracy="off")
    for _ in range(options.epochs):
        model.train()
        metrics.reset()
        for batch, last in loader.with_last():
            step.add(batch, last=last)
        metrics.compute()
    return model


def _trainer(**options: Any) -> Callable[[Any, Any, Any], Any]:
    def run(model: Any, dataset: Any, run_options: Any) -> Any:
        return overhead._run_trainer(model, dataset, run_options, overhead.Stopwatch(), optimizer=overhead._users_adam,
                              **options)
    return run


# -- probes: what added work costs inside a step, against what the same work costs alone ----------------------


def _probe_loop(model: Any, loader: Any, epochs: int, extra: Callable[[Any, Any], Any]) -> None:
    """``overhead.py``'s minimal loop on the user's Adam, calling ``extra(logits, targets)`` after the loss: work
    that leaves the training as it is."""
    import torch
    import torch.nn.functional as F

    optimizer = torch.optim.Adam(model.parameters(), lr=overhead.LR)
    for _ in range(epochs):
        model.train()
        for inputs, targets in loader:
            optimizer.zero_grad(set_to_none=True)
            logits = model(inputs)
            loss = F.cross_entropy(logits, targets)
            extra(logits, targets)
            loss.backward()
            optimizer.step()
            loss.item()


def _nothing(logits: Any, targets: Any) -> None:
    return None


def _one_op(logits: Any, targets: Any) -> Any:
    return logits.detach()  # one small torch operation


def _accuracy_ops(logits: Any, targets: Any) -> Any:
    return (logits.argmax(dim=1) == targets).sum().item()  # a hand-written accuracy: three operations and a read


def _numpy_sum(logits: Any, targets: Any) -> Any:
    return int(targets.numpy().sum())  # a small read of the batch through code the step never runs (numpy)


def _function(value: Any) -> Any:
    a = value
    b = a
    c = b
    d = c
    e = d
    f = e
    return f


def _thirty_calls(logits: Any, targets: Any) -> Any:
    for _ in range(30):  # thirty calls of an 8-line function: about what the Trainer adds to a step in Python
        logits = _function(logits)
    return logits


PROBES: dict[str, Callable[[Any, Any], Any]] = {
    "probe:none": _nothing,
    "probe:1-op": _one_op,
    "probe:accuracy-ops": _accuracy_ops,
    "probe:numpy-sum": _numpy_sum,
    "probe:30-calls": _thirty_calls,
}


def _probe(extra: Callable[[Any, Any], Any]) -> Callable[[Any, Any, Any], Any]:
    def run(model: Any, dataset: Any, options: Any) -> Any:
        _probe_loop(model, overhead._loader(dataset, options), options.epochs, extra)
        return model
    return run


def _alone_us(extra: Callable[[Any, Any], Any], dataset: Any, batch_size: int) -> float:
    """Microseconds one call of ``extra`` takes alone, called over and over on one batch's logits (best of 5)."""
    import timeit

    inputs, targets = dataset.tensors
    logits = overhead._model("small", 0)(inputs[:batch_size])  # an output that needs grad, as in a step
    number = 2000
    best = min(timeit.repeat(lambda: extra(logits, targets[:batch_size]), number=number, repeat=5))
    return best / number * 1e6


SIDES: dict[str, Callable[[Any, Any, Any], Any]] = {
    BASE: run_minimal_adam,
    "loader": run_loader,
    "primitives": run_primitives,
    "train-step": run_train_step,
    "trainer-off": _trainer(**OFF),
    **{f"+{name}": _trainer(**{**OFF, name: value}) for name, value in OPTIONS.items()},
    "trainer": _trainer(),
    **{name: _probe(extra) for name, extra in PROBES.items()},
}


def measure(sides: list[str], rounds: int, epochs: int) -> dict[str, Any]:
    """Per-step CPU seconds of each side in each round, each round's ratio to the base and to trainer-off, and
    each side's training loss after its warm-up run: every side must end at the same loss (the same work)."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    threads = torch.get_num_threads()  # measured on one thread; the caller's count is put back at the end
    torch.set_num_threads(1)
    dataset = overhead._data("small", 0)
    batch_size = overhead.SIZES["small"][4]
    clock = overhead.StepClock()
    handle = register_optimizer_step_post_hook(clock)

    losses: dict[str, float] = {}

    def once(side: str) -> tuple[float, float]:
        """(per-step CPU seconds, the whole run's CPU seconds) of one run of ``side``."""
        with tempfile.TemporaryDirectory() as folder, contextlib.redirect_stdout(io.StringIO()), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            options = overhead.RunOptions(epochs=epochs, batch_size=batch_size, seed=0, log_every=50, folder=folder)
            untrained = overhead._model("small", 0)
            clock.marks, clock.active = [], True
            start = time.process_time()  # every thread: a checkpoint's background commit too
            try:
                model = SIDES[side](untrained, dataset, options)
            finally:
                whole = time.process_time() - start
                clock.active = False
        torch.set_num_threads(1)
        if side not in losses:
            losses[side] = _training_loss(model, dataset)
        return clock.per_step(epochs)["cpu"], whole

    try:
        for side in sides:  # warm-up: lazy imports and first calls outside the rounds
            once(side)
        times: dict[str, list[float]] = {side: [] for side in sides}
        runs: dict[str, list[float]] = {side: [] for side in sides}
        for _ in range(rounds):
            for side in random.sample(sides, len(sides)):
                per_step, whole = once(side)
                times[side].append(per_step)
                runs[side].append(whole)
    finally:
        handle.remove()
        torch.set_num_threads(threads)
    report: dict[str, Any] = {"rounds": rounds, "epochs": epochs, "sides": {}, "losses": losses,
                              "same_result": len({round(v, 6) for v in losses.values()}) == 1}
    for side in sides:
        entry = {"us_per_step": statistics.median(times[side]) * 1e6,
                 "ratio": _ratio(times[side], times[BASE]),
                 "ms_per_run": statistics.median(runs[side]) * 1e3,
                 "run_ratio": _ratio(runs[side], runs[BASE])}
        if side.startswith("+") and "trainer-off" in times:
            entry["ratio_to_trainer_off"] = _ratio(times[side], times["trainer-off"])
            entry["run_ratio_to_trainer_off"] = _ratio(runs[side], runs["trainer-off"])
        if side in PROBES and side != "probe:none" and "probe:none" in times:
            # per round, this probe's step less the empty probe's: what the added work costs inside a step
            added = statistics.median(a - b for a, b in zip(times[side], times["probe:none"])) * 1e6
            alone = _alone_us(PROBES[side], dataset, batch_size)
            entry["probe"] = {"added_us": added, "alone_us": alone, "in_step_over_alone": added / alone}
        report["sides"][side] = entry
    return report


def _training_loss(model: Any, dataset: Any) -> float:
    import torch
    import torch.nn.functional as F

    inputs, targets = dataset.tensors
    model.eval()
    with torch.no_grad():
        return float(F.cross_entropy(model(inputs), targets))


def _ratio(side: list[float], base: list[float]) -> dict[str, float]:
    """Median and quartiles of the per-round ratios."""
    ratios = sorted(a / b for a, b in zip(side, base))
    if len(ratios) < 2:
        return {"median": ratios[0], "q1": ratios[0], "q3": ratios[0]}
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return {"median": statistics.median(ratios), "q1": q1, "q3": q3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--epochs", type=int, default=2, help="epochs per side per round (64 steps each)")
    parser.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated, {BASE} first")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if not sides or sides[0] != BASE or any(s not in SIDES for s in sides):
        parser.error(f"--sides must start with {BASE} and use only: {', '.join(SIDES)}")
    report = measure(sides, args.rounds, args.epochs)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    import torch

    print(f"Small MLP, the user's Adam, CPU, one thread (torch {torch.__version__}); {args.rounds} rounds of "
          f"{args.epochs} epochs; per optimizer step, then the whole run; per-round ratio median [quartiles]\n")

    def cell(ratio: dict[str, float] | None) -> str:
        return f"{ratio['median']:.3f} [{ratio['q1']:.3f}-{ratio['q3']:.3f}]" if ratio else ""

    print(f"{'side':<14} {'us/step':>8}  {'vs ' + BASE:<23} {'vs trainer-off':<23} {'ms/run':>8}  "
          f"{'vs ' + BASE:<23} vs trainer-off")
    for side, e in report["sides"].items():
        print(f"{side:<14} {e['us_per_step']:>8.1f}  {cell(e['ratio']):<23} {cell(e.get('ratio_to_trainer_off')):<23} "
              f"{e['ms_per_run']:>8.1f}  {cell(e['run_ratio']):<23} {cell(e.get('run_ratio_to_trainer_off'))}")
    probes = {side: e["probe"] for side, e in report["sides"].items() if "probe" in e}
    if probes:
        print("\nthe same work inside a step (the probe's step less probe:none's, per round) and alone (best of 5)")
        print(f"{'probe':<20} {'in a step, us':>14} {'alone, us':>10} {'ratio':>6}")
        for side, p in probes.items():
            print(f"{side:<20} {p['added_us']:>14.1f} {p['alone_us']:>10.2f} {p['in_step_over_alone']:>6.1f}")
    losses = report["losses"]
    if report["same_result"]:
        print(f"\nevery side ends at training loss {next(iter(losses.values())):.6f}")
    else:
        print("\nthe sides end at different losses, so they did not do the same work: " + ", ".join(
            f"{side} {loss:.6f}" for side, loss in losses.items()))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
