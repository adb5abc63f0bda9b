"""What the Trainer, the runtime guards and other libraries cost against the loop a user would write.

Every side trains the same MLP (same seed, so the same initial weights) on the same synthetic data with AdamW
(same lr and weight decay), shuffled by a ``RandomSampler`` with the same seeded generator, on CPU in fp32:

- ``minimal`` (the baseline): the loop a user would write: one-group ``AdamW(model.parameters())``, a
  ``DataLoader`` with a seeded ``RandomSampler``, and per step ``zero_grad(set_to_none=True)``, forward,
  ``F.cross_entropy``, ``backward``, ``step``, ``loss.item()``.
- ``same-work``: the loop that does what the Trainer does: no weight decay on biases (the Trainer's default
  parameter groups) with torch's fused AdamW kernel (``fused=True``, the Trainer's default where torch has one),
  a sample-weighted running loss and accuracy kept as tensors and read once per epoch.
- ``guard``: the minimal loop inside ``trainwise.guard(model, optimizer, check_every=log_every)``;
  ``guard-every-8`` with ``forward_every=8`` (the forward hooked on one step in 8, as the Trainer does).
- ``trainer``: ``trainwise.Trainer`` as a user gets it: progress ``auto`` (plain lines, the child's output is
  a pipe), a checkpoint at every epoch end, the learning-curve plot (when matplotlib is installed), the
  diagnosis and the runtime guards on; run folder in a temporary directory, no validation.
- ``trainer-off``: the Trainer with everything optional off (``progress="off", checkpoints=False, plot=False,
  diagnose=False, guards="off", accuracy="off"``).
- ``minimal-adam``, ``trainer-adam``, ``trainer-adam-off``: the user's own optimizer. The minimal loop with
  ``torch.optim.Adam(model.parameters(), lr)``, and the Trainer (defaults, and everything optional off) given
  the same ``optimizer=lambda params: torch.optim.Adam(params, lr=LR)``: the Trainer's fused AdamW no longer
  gives it a lead, so these ratios are its own cost. ``trainer-adam`` and ``trainer-adam-off`` are compared
  with ``minimal-adam``.
- ``fabric``, ``accelerate``, ``lightning``: the minimal loop through Lightning Fabric (``Fabric(accelerator=
  "cpu", devices=1, precision="32-true")``, ``setup``, ``setup_dataloaders``, ``fabric.backward``), through
  Hugging Face Accelerate (``Accelerator(cpu=True)``, ``prepare``, ``accelerator.backward``), and as a
  ``LightningModule`` fitted by ``lightning.Trainer(accelerator="cpu", devices=1)`` with its defaults (logger,
  epoch-end checkpoint, progress bar, model summary), its run folder in a temporary directory. They run when
  their package imports: ``pip install -e ".[bench]" -c constraints.txt``.

Every measurement is a fresh process (``--child``) that builds the data, warms up by running the same side on
a throwaway model and a few batches, then times one whole run. Two figures come out of it:

- per optimizer step: the mean interval between consecutive optimizer steps within an epoch, read from a
  global ``torch.optim`` step hook (the same for every side), so it holds everything done per step (data,
  forward, backward, step, metrics, logging, guard checks) and nothing done once per epoch or per run;
- the whole run: from before the optimizer (or Trainer, Fabric, Accelerator) is built to the end of the run,
  set-up and epoch ends (checkpoints, plot, diagnosis) included; imports and first-call costs are paid by the
  warm-up and are not in it.

Each clock is measured both as wall time and as process CPU time (steadier when other processes share the
cores). The parent interleaves the sides in a random order within each round and reports the medians, their
spread (min-max), the ratio of the medians against ``minimal`` (the Trainer sides against ``same-work`` too),
and the median and range of the per-round paired ratios. Each side reports the loss of its trained weights on
the whole training set: the one-group sides (minimal, guard, fabric, accelerate, lightning) must agree with
each other, and the bias-group sides (same-work, trainer, trainer-off) with each other; if they do not, the
sides no longer do the same work and the ratios mean little.

    python benchmarks/overhead.py                        # both sizes, 7 rounds each
    python benchmarks/overhead.py --sizes small --repeats 11 --json
    python benchmarks/overhead.py --sides minimal,trainer  # only these sides (minimal is always the baseline)

Nothing here asserts a time: the numbers mean something only as ratios within one run, on one machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import rounds

# name: (in_features, hidden layer widths, classes, samples, batch size, default epochs)
SIZES: dict[str, tuple[int, tuple[int, ...], int, int, int, int]] = {
    "small": (32, (64,), 10, 4096, 64, 10),  # 64 steps/epoch; per-step overhead dominates
    "large": (512, (2048, 2048), 10, 4096, 256, 1),  # 16 steps/epoch; compute dominates
}
LR = 1e-3
WEIGHT_DECAY = 0.01
BASELINE = "minimal"
SAME_WORK = "same-work"
INSTALL = 'pip install -e ".[bench]" -c constraints.txt'
RESULT_MARK = "overhead-result: "  # the child's JSON line, among whatever the side itself prints
LOSS_TOLERANCE = {"rel_tol": 1e-4, "abs_tol": 1e-6}

# Sides whose final weights must agree: the same optimizer groups, the same data order, the same seed.
FAMILIES = {
    "one AdamW group": ("minimal", "guard", "guard-every-8", "fabric", "accelerate", "lightning"),
    "no decay on biases": ("same-work", "trainer", "trainer-off"),
    "the user's Adam": ("minimal-adam", "trainer-adam", "trainer-adam-off"),
}
# side -> the module that must import for it to run
PEERS = {"fabric": "lightning.fabric", "accelerate": "accelerate", "lightning": "lightning"}
USER_OPTIMIZER = "minimal-adam"  # the baseline of the sides given the user's own optimizer
# (side, baseline, {size: {figure: target ratio}}): the per-round ratio medians, both clocks
TARGETS = (
    ("trainer", BASELINE, {"small": {"per_step": 1.05, "run": 1.05}, "large": {"per_step": 1.01, "run": 1.01}}),
    ("trainer-off", BASELINE, {"small": {"per_step": 1.02, "run": 1.02}, "large": {"per_step": 1.01, "run": 1.01}}),
    ("guard", BASELINE, {"small": {"per_step": 1.02, "run": 1.02}, "large": {"per_step": 1.02, "run": 1.02}}),
    ("trainer-adam", USER_OPTIMIZER, {"small": {"per_step": 1.05, "run": 1.10},
                                      "large": {"per_step": 1.01, "run": 1.01}}),
    ("trainer-adam-off", USER_OPTIMIZER, {"small": {"per_step": 1.02, "run": 1.10},
                                          "large": {"per_step": 1.01, "run": 1.01}}),
)
FUSED = True  # same-work uses fused AdamW as the Trainer does (trainwise.build_optimizer)
CLOCKS = ("cpu", "wall")  # cpu: process CPU time, less sensitive to a busy machine


# -- child: one timed run in this process --------------------------------------------------------------


@dataclasses.dataclass
class RunOptions:
    epochs: int
    batch_size: int
    seed: int
    log_every: int
    folder: str  # an empty temporary directory for the side's run folder


class Stopwatch:
    """Wall and process CPU time between ``start()`` and ``stop()``, both called by the side."""

    def __init__(self) -> None:
        self.started = self.stopped = (math.nan, math.nan)

    def start(self) -> None:
        self.started = (time.perf_counter(), time.process_time())

    def stop(self) -> None:
        self.stopped = (time.perf_counter(), time.process_time())

    def seconds(self) -> dict[str, float]:
        return {
            "wall": self.stopped[0] - self.started[0],
            "cpu": self.stopped[1] - self.started[1],
        }


class StepClock:
    """Stamps every optimizer step of any optimizer (a global ``torch.optim`` post-step hook)."""

    def __init__(self) -> None:
        self.active = False
        self.marks: list[tuple[float, float]] = []

    def __call__(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.active:
            self.marks.append((time.perf_counter(), time.process_time()))

    def per_step(self, epochs: int) -> dict[str, float]:
        """Mean interval between consecutive steps within an epoch, per clock (epoch ends left out)."""
        per_epoch = len(self.marks) // epochs
        totals = [0.0, 0.0]
        intervals = 0
        for epoch in range(epochs):
            first, last = self.marks[epoch * per_epoch], self.marks[(epoch + 1) * per_epoch - 1]
            totals = [totals[0] + last[0] - first[0], totals[1] + last[1] - first[1]]
            intervals += per_epoch - 1
        return {"wall": totals[0] / intervals, "cpu": totals[1] / intervals}


def _data(size: str, seed: int) -> Any:
    import torch
    from torch.utils.data import TensorDataset

    features, _, classes, samples, _, _ = SIZES[size]
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, features, generator=generator)
    teacher = torch.randn(features, classes, generator=generator)
    targets = (inputs @ teacher + 0.5 * torch.randn(samples, classes, generator=generator)).argmax(dim=1)
    return TensorDataset(inputs, targets)


def _model(size: str, seed: int) -> Any:
    import torch

    features, hidden, classes, *_ = SIZES[size]
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    width = features
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    layers.append(torch.nn.Linear(width, classes))
    return torch.nn.Sequential(*layers)


def _loader(dataset: Any, options: RunOptions, *, drained: bool = False) -> Any:
    """A DataLoader shuffled by a seeded sampler, as trainwise.data.seeded_loader builds it: every side sees
    the batches in the same order (shuffle=True costs the same per step).

    ``drained``: the sampler draws each epoch's indices up front, tail included. ``RandomSampler`` makes one more
    (empty) draw from its generator once its last index is consumed and it is asked for the next; a loop that
    stops after ``len(loader)`` batches (Lightning's) never asks, so from the second epoch on its batches would
    come in another order than the other sides' and the same-result check would compare different runs."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    class DrainedSampler(RandomSampler):
        def __iter__(self) -> Any:
            return iter(list(super().__iter__()))

    sampler_type = DrainedSampler if drained else RandomSampler
    sampler = sampler_type(dataset, generator=torch.Generator().manual_seed(options.seed))
    return DataLoader(dataset, batch_size=options.batch_size, sampler=sampler)


def _minimal_loop(model: Any, optimizer: Any, loader: Any, epochs: int, backward: Callable[[Any], None]) -> float:
    """The loop a user would write; ``backward`` is ``loss.backward`` or a library's own."""
    import torch.nn.functional as F

    running = 0.0
    for _ in range(epochs):
        model.train()
        for inputs, targets in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(inputs), targets)
            backward(loss)
            optimizer.step()
            running += loss.item()
    return running


def _plain_backward(loss: Any) -> None:
    loss.backward()


def run_minimal(model: Any, dataset: Any, options: RunOptions, watch: Stopwatch) -> Any:
    import torch

    watch.start()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    _minimal_loop(model, optimizer, _loader(dataset, options), options.epochs, _plain_backward)
    watch.stop()
    return model


def run_minimal_adam(model: Any, dataset: Any, options: RunOptions, watch: Stopwatch) -> Any:
    import torch

    watch.start()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    _minimal_loop(model, optimizer, _loader(dataset, options), options.epochs, _plain_backward)
    watch.stop()
    return model


def _users_adam(params: Any) -> Any:
    import torch

    return torch.optim.Adam(params, lr=LR)


def run_guard(model: Any, dataset: Any, options: RunOptions, watch: Stopwatch, *, forward_every: int = 1) -> Any:
    import torch

    import trainwise

    watch.start()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    loader = _loader(dataset, options)
    with trainwise.guard(model, optimizer, check_every=options.log_every, forward_every=forward_every):
        _minimal_loop(model, optimizer, loader, options.epochs, _plain_backward)
    watch.stop()
    return model


def run_guard_every_8(model: Any, dataset: Any, options: RunOptions, watch: Stopwatch) -> Any:
    return run_guard(model, dataset, options, watch, forward_every=8)


def run_same_work(model: Any, dataset: Any, options: RunOptions, watch: Stopwatch) -> Any:
    """What the Trainer does per step, written by hand: bias groups, metrics as tensors read once per epoch."""
    import torch
    import torch.nn.functional as F

    watch.start()
    decay = [p for name, p in model.named_parameters() if not name.endswith("bias")]
    no_decay = [p for name, p in model.named_parameters() if name.endswith("bias")]
    groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = {"fused": True} if FUSED else {}  # the Trainer's default optimizer kernel, where torch has one
    optimizer = torch.optim.AdamW(groups, lr=LR, weight_decay=WEIGHT_DECAY, **fused)
    loader = _loader(dataset, options)
    for _ in range(options.epochs):
        model.train()
        total_loss = torch.zeros((), dtype=torch.float64)
        correct = torch.zeros((), dtype=torch.int64)
        seen = 0
        for inputs, targets in loader:
            logits = model(inputs)
            loss = F.cross_entropy(logits, targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            n = targets.shape[0]
            total_loss += loss.detach() * n
            correct += (logits.detach().argmax(dim=1) == targets).sum()
            seen += n
        _ = (total_loss.item() / seen, correct.item() / seen)
    watch.stop()
    return model


def _run_trainer(model: Any, dataset: Any, options: RunOptions, watch: Stopwatch, **extra: Any) -> Any:
    from trainwise import Trainer

    watch.start()
    trainer = Trainer(
        epochs=options.epochs,
        lr=LR,
        weight_decay=WEIGHT_DECAY,
        batch_size=options.batch_size,
        device="cpu",  # "auto" would pick an accelerator where there is one; every side here runs on CPU
        precision="fp32",
        seed=options.seed,
        log_every=options.log_every,
        run_dir=os.path.join(options.folder, "run"),
        **extra,
    )
    result = trainer.fit(model, dataset, val_data=None)
    watch.stop()
    return result.model


def run_trainer(model: Any, dataset: Any, options: RunOptions, watch: Stopwatch) -> Any:
    return _run_trainer(model, dataset, options, watch)


def run_trainer_off(model: Any, dataset: Any, options: RunOptions, watch: Stopwatch) -> Any:
    return _run_trainer(
        model, dataset, options, watch,
        progress="off", checkpoints=False, plot=False, diagnose=False, guards="off", accuracy="off",
    )


def run_trainer_adam(model: Any, dataset: Any, options: RunOptions, watch: Stopwatch) -> Any:
    return _run_trainer(model, dataset, options, watch, optimizer=_users_adam)


def run_trainer_adam_off(model: Any, dataset: Any, options: RunOptions, watch: Stopwatch) -> Any:
    return _run_trainer(
        model, dataset, options, watch, optimizer=_users_adam,
        progress="off", checkpoints=False, plot=False, diagnose=False, guards="off", accuracy="off",
    )


def run_fabric(model: Any, dataset: Any, options: RunOptions, watch: Stopwatch) -> Any:
    import torch
    from lightning.fabric import Fabric

    watch.start()
    fabric = Fabric(accelerator="cpu", devices=1, precision="32-true")
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    wrapped, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(_loader(dataset, options))
    _minimal_loop(wrapped, optimizer, loader, options.epochs, fabric.backward)
    watch.stop()
    return model


def run_accelerate(model: Any, dataset: Any, options: RunOptions, watch: Stopwatch) -> Any:
    import torch
    from accelerate import Accelerator

    watch.start()
    accelerator = Accelerator(cpu=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    wrapped, optimizer, loader = accelerator.prepare(model, optimizer, _loader(dataset, options))
    _minimal_loop(wrapped, optimizer, loader, options.epochs, accelerator.backward)
    watch.stop()
    return accelerator.unwrap_model(wrapped)


def run_lightning(model: Any, dataset: Any, options: RunOptions, watch: Stopwatch) -> Any:
    import lightning
    import torch
    import torch.nn.functional as F

    class Module(lightning.LightningModule):
        def __init__(self, net: torch.nn.Module) -> None:
            super().__init__()
            self.net = net

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            inputs, targets = batch
            loss = F.cross_entropy(self.net(inputs), targets)
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.net.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)

    watch.start()
    loader = _loader(dataset, options, drained=True)  # the same batch order as the other sides (see _loader)
    module = Module(model)
    trainer = lightning.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=options.epochs,
        log_every_n_steps=options.log_every,  # its default is 50, as --log-every's
        default_root_dir=options.folder,
    )
    trainer.fit(module, train_dataloaders=loader)
    watch.stop()
    # its defaults depend on what else is installed (tensorboard, rich): say which ones ran
    NOTES.append(
        f"lightning.Trainer defaults here: logger {type(trainer.logger).__name__}, progress bar "
        f"{type(trainer.progress_bar_callback).__name__}, checkpoint callback "
        f"{type(trainer.checkpoint_callback).__name__}"
    )
    return model


RUNNERS: dict[str, Callable[[Any, Any, RunOptions, Stopwatch], Any]] = {
    "minimal": run_minimal,
    "same-work": run_same_work,
    "guard": run_guard,
    "guard-every-8": run_guard_every_8,
    "trainer": run_trainer,
    "trainer-off": run_trainer_off,
    "minimal-adam": run_minimal_adam,
    "trainer-adam": run_trainer_adam,
    "trainer-adam-off": run_trainer_adam_off,
    "fabric": run_fabric,
    "accelerate": run_accelerate,
    "lightning": run_lightning,
}


NOTES: list[str] = []  # what the reader should know about how the timed run went here


def _notes(side: str) -> list[str]:
    import importlib.util

    if side == "trainer" and importlib.util.find_spec("matplotlib") is None:
        NOTES.append('matplotlib is not installed, so the Trainer draws no plot (pip install -e ".[plot]")')
    return sorted(set(NOTES))


def child(args: argparse.Namespace) -> None:
    import torch
    import torch.nn.functional as F
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils.data import Subset

    torch.set_num_threads(args.threads)
    _, _, _, _, batch_size, default_epochs = SIZES[args.size]
    epochs = args.epochs or default_epochs
    dataset = _data(args.size, args.seed)
    run = RUNNERS[args.child]
    clock = StepClock()
    register_optimizer_step_post_hook(clock)

    def options(epochs: int, folder: str) -> RunOptions:
        return RunOptions(epochs=epochs, batch_size=batch_size, seed=args.seed, log_every=args.log_every,
                          folder=folder)

    # Warm-up: the same side on a throwaway model and a few batches (imports, allocator, first-call paths).
    warmup = Subset(dataset, range(min(len(dataset), args.warmup_batches * batch_size)))
    with tempfile.TemporaryDirectory() as folder:
        run(_model(args.size, args.seed), warmup, options(1, folder), Stopwatch())

    NOTES.clear()  # the warm-up's
    watch = Stopwatch()
    model = _model(args.size, args.seed)
    with tempfile.TemporaryDirectory() as folder:
        clock.active = True
        trained = run(model, dataset, options(epochs, folder), watch)
        clock.active = False
    steps_per_epoch = math.ceil(len(dataset) / batch_size)
    if len(clock.marks) != epochs * steps_per_epoch:
        raise SystemExit(f"{args.child} took {len(clock.marks)} optimizer steps, expected {epochs * steps_per_epoch}.")

    # The same-result check: the trained weights' loss on the whole training set, computed the same way for all.
    inputs, targets = dataset.tensors
    trained.eval()
    with torch.no_grad():
        logits = trained(inputs)
        loss = F.cross_entropy(logits, targets).item()
        accuracy = (logits.argmax(dim=1) == targets).float().mean().item()
    measured = {
        "side": args.child,
        "size": args.size,
        "epochs": epochs,
        "steps": len(clock.marks),
        "threads": torch.get_num_threads(),  # after the run: a library that changed it shows here
        "per_step": clock.per_step(epochs),
        "run": watch.seconds(),
        "loss": loss,
        "accuracy": accuracy,
        "notes": _notes(args.child),
    }
    print(RESULT_MARK + json.dumps(measured), flush=True)


# -- parent: interleaved fresh processes, medians, spread, ratios ---------------------------------------


def _spawn(side: str, size: str, args: argparse.Namespace) -> dict:
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        side,
        "--size",
        size,
        "--threads",
        str(args.threads),
        "--seed",
        str(args.seed),
        "--log-every",
        str(args.log_every),
        "--warmup-batches",
        str(args.warmup_batches),
    ]
    epochs = {"small": args.small_epochs, "large": args.large_epochs}[size]
    if epochs:
        command += ["--epochs", str(epochs)]
    return rounds.child_result(command, threads=args.threads, mark=RESULT_MARK, label=f"{side}/{size}")


def _summary(values: list[float]) -> dict[str, float]:
    median = statistics.median(values)
    return {"median": median, "min": min(values), "max": max(values), "spread": (max(values) - min(values)) / median}


def _missing(side: str) -> str | None:
    """Why a peer side cannot run here, or None."""
    module = PEERS.get(side)
    if module is None:
        return None
    try:
        importlib.import_module(module)
    except Exception as exc:  # ImportError, or a broken install raising anything else on import
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


def _choose_sides(requested: str | None) -> tuple[list[str], dict[str, str]]:
    """The sides to run, in the canonical order, and the peers left out (side -> why)."""
    if requested is None:
        skipped = {side: why for side in RUNNERS if (why := _missing(side))}
        return [side for side in RUNNERS if side not in skipped], skipped
    names = [s.strip() for s in requested.split(",") if s.strip()]
    unknown = [name for name in names if name not in RUNNERS]
    if unknown or BASELINE not in names:
        raise SystemExit(f"--sides must include {BASELINE} and only these: {', '.join(RUNNERS)}.")
    for name in names:
        if why := _missing(name):
            raise SystemExit(
                f"side {name!r} needs {PEERS[name].split('.')[0]}, which does not import here ({why}); "
                f"install the benchmark extras with {INSTALL}."
            )
    return [side for side in RUNNERS if side in names], {}


def _ratios(side_runs: list[dict], base_runs: list[dict]) -> dict[str, Any]:
    """Per step and whole run, per clock: ratio of the medians and the per-round paired ratios."""
    out: dict[str, Any] = {}
    for figure in ("per_step", "run"):
        out[figure] = {}
        for clock in CLOCKS:
            side_values = [r[figure][clock] for r in side_runs]
            base_values = [r[figure][clock] for r in base_runs]
            out[figure][clock] = {
                "ratio": statistics.median(side_values) / statistics.median(base_values),
                "pair_ratio": _summary([s / b for s, b in zip(side_values, base_values)]),
            }
    return out


def _same_result(runs: dict[str, list[dict]]) -> dict[str, Any]:
    families: dict[str, Any] = {}
    for family, members in FAMILIES.items():
        present = [side for side in members if side in runs]
        if not present:
            continue
        reference = runs[present[0]][0]["loss"]
        losses = [r["loss"] for side in present for r in runs[side]]
        families[family] = {
            "sides": present,
            "final_loss": {side: runs[side][0]["loss"] for side in present},
            "max_relative_difference": max(abs(loss - reference) for loss in losses) / abs(reference),
            # every round of every side of the family ends at the reference loss
            "match": all(math.isclose(loss, reference, **LOSS_TOLERANCE) for loss in losses),
        }
    return families


def _targets(entry: dict[str, Any], size: str) -> list[dict[str, Any]]:
    rows = []
    for side, baseline, limits in TARGETS:
        ratios = entry["vs"].get(baseline, {}).get(side)
        if ratios is None:
            continue
        figures = {
            f"{figure} {clock}": ratios[figure][clock]["pair_ratio"]["median"]
            for figure in ("per_step", "run")
            for clock in CLOCKS
        }
        over = [name for name, value in figures.items() if value > limits[size][name.split()[0]]]
        rows.append({"side": side, "baseline": baseline, "target": limits[size], "per_round_ratio_median": figures,
                     "met": not over, "over": over})
    return rows


def parent(args: argparse.Namespace) -> int:
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    for size in sizes:
        if size not in SIZES:
            raise SystemExit(f"unknown size {size!r}; choose from {', '.join(SIZES)}.")
    sides, skipped = _choose_sides(args.sides)
    order = random.Random(args.seed)
    runs: dict[str, dict[str, list[dict]]] = {size: {side: [] for side in sides} for size in sizes}
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    started = time.perf_counter()
    for repeat in range(args.repeats):
        for size in sizes:
            group = list(sides)
            order.shuffle(group)
            for side in group:
                runs[size][side].append(_spawn(side, size, args))
        if not args.json:
            print(
                f"  round {repeat + 1}/{args.repeats} done ({time.perf_counter() - started:.0f} s)",
                file=sys.stderr,
                flush=True,
            )

    report: dict[str, Any] = {
        "command": args.command,
        "repeats": args.repeats,
        "threads": args.threads,
        "seed": args.seed,
        "log_every": args.log_every,
        "sides": sides,
        "skipped": {side: f"{why}; {INSTALL}" for side, why in skipped.items()},
        "load_average_1min": [load_before, os.getloadavg()[0] if load_before is not None else None],
        "seconds": time.perf_counter() - started,
        "sizes": {},
    }
    for size in sizes:
        features, hidden, classes, samples, batch_size, _ = SIZES[size]
        size_runs = runs[size]
        base = size_runs[BASELINE]
        entry: dict[str, Any] = {
            "model": "-".join(map(str, (features, *hidden, classes))),
            "samples": samples,
            "batch_size": batch_size,
            "epochs": base[0]["epochs"],
            "steps": base[0]["steps"],
            "sides": {
                side: {
                    "per_step": {clock: _summary([r["per_step"][clock] for r in rs]) for clock in CLOCKS},
                    "run": {clock: _summary([r["run"][clock] for r in rs]) for clock in CLOCKS},
                    "final_loss": rs[0]["loss"],
                    "final_accuracy": rs[0]["accuracy"],
                    "threads": sorted({r["threads"] for r in rs}),
                    "notes": sorted({note for r in rs for note in r["notes"]}),
                }
                for side, rs in size_runs.items()
            },
            "vs": {BASELINE: {side: _ratios(rs, base) for side, rs in size_runs.items() if side != BASELINE}},
        }
        if SAME_WORK in size_runs:
            entry["vs"][SAME_WORK] = {
                side: _ratios(size_runs[side], size_runs[SAME_WORK])
                for side in ("trainer", "trainer-off")
                if side in size_runs
            }
        if USER_OPTIMIZER in size_runs:
            entry["vs"][USER_OPTIMIZER] = {
                side: _ratios(size_runs[side], size_runs[USER_OPTIMIZER])
                for side in ("trainer-adam", "trainer-adam-off")
                if side in size_runs
            }
        entry["same_result"] = _same_result(size_runs)
        entry["targets"] = _targets(entry, size)
        report["sizes"][size] = entry

    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    _print_report(report)
    return 0


def _ms(s: dict[str, float]) -> str:
    digits = 3 if s["max"] < 0.01 else 1
    return f"{s['median'] * 1e3:.{digits}f} [{s['min'] * 1e3:.{digits}f}-{s['max'] * 1e3:.{digits}f}]"


def _ratio_cells(r: dict[str, Any]) -> str:
    p = r["pair_ratio"]
    return f"{r['ratio']:>6.3f} {p['median']:>6.3f} [{p['min']:.3f}-{p['max']:.3f}]"


def _print_report(report: dict[str, Any]) -> None:
    load = report["load_average_1min"]
    print(
        f"\nOverhead against the minimal loop: {report['repeats']} interleaved round(s) of fresh processes per size, "
        f"{report['threads']} thread(s), CPU fp32, log_every {report['log_every']}"
    )
    if load[0] is not None:
        print(f"load average (1 min) before/after: {load[0]:.2f}/{load[1]:.2f}; took {report['seconds']:.0f} s")
    for side, why in report["skipped"].items():
        print(f"skipped {side}: {why}")
    print(
        "per step: mean interval between optimizer steps within an epoch; whole run: optimizer/Trainer set-up, "
        "loop and epoch ends.\nms median [min-max] over rounds; then ratio of medians, and the per-round paired "
        "ratio median [min-max], against minimal (rows 'X / same-work': against same-work)"
    )
    header = (f"{'size':<6} {'clock':<5} {'side':<24} {'per step, ms':<23} {'ratio':>6} {'per-round':<21} "
              f"{'whole run, ms':<26} {'ratio':>6} per-round")
    for size, e in report["sizes"].items():
        print(f"\n{size}: model {e['model']}, batch {e['batch_size']}, {e['epochs']} epoch(s), {e['steps']} steps")
        print(header)
        for clock in CLOCKS:
            for side, s in e["sides"].items():
                line = f"{size:<6} {clock:<5} {side:<24} {_ms(s['per_step'][clock]):<23} "
                if side == BASELINE:
                    print(f"{line}{'':<28} {_ms(s['run'][clock])}")
                    continue
                r = e["vs"][BASELINE][side]
                print(f"{line}{_ratio_cells(r['per_step'][clock]):<28} {_ms(s['run'][clock]):<26} "
                      f"{_ratio_cells(r['run'][clock])}")
            for baseline in (SAME_WORK, USER_OPTIMIZER):
                for side, r in e["vs"].get(baseline, {}).items():
                    label = f"{side} / {baseline}"
                    print(f"{size:<6} {clock:<5} {label:<24} {'':<23} {_ratio_cells(r['per_step'][clock]):<28} "
                          f"{'':<26} {_ratio_cells(r['run'][clock])}")
    print("\ntargets (per-round ratio medians against the side's baseline; per step / whole run, cpu and wall):")
    for size, e in report["sizes"].items():
        for t in e["targets"]:
            figures = ", ".join(f"{name} {value:.3f}" for name, value in t["per_round_ratio_median"].items())
            verdict = "met" if t["met"] else f"NOT met ({', '.join(t['over'])} over)"
            limit = f"{t['target']['per_step']:.2f}/{t['target']['run']:.2f}"
            print(f"  {size:<6} {t['side']:<16} / {t['baseline']:<12} <= {limit}: {figures}: {verdict}")
    print("\nsame result (loss of the trained weights on the whole training set; each family must agree):")
    for size, e in report["sizes"].items():
        for family, f in e["same_result"].items():
            losses = ", ".join(f"{side} {loss:.6f}" for side, loss in f["final_loss"].items())
            if len(f["sides"]) == 1 and report["repeats"] == 1:
                verdict = "only one side, nothing to compare"
            elif f["match"]:
                verdict = "match"
            else:
                verdict = (f"DIFFER (up to {f['max_relative_difference']:.1e} relative): "
                           "these sides no longer do the same work")
            print(f"  {size:<6} {family}: {losses}: {verdict}")
    print("  (the families differ on purpose: the second puts no weight decay on biases, the third uses Adam)")
    notes = {(side, note) for e in report["sizes"].values() for side, s in e["sides"].items() for note in s["notes"]}
    threads = {(side, tuple(s["threads"])) for e in report["sizes"].values() for side, s in e["sides"].items()
               if s["threads"] != [report["threads"]]}
    for side, note in sorted(notes):
        print(f"note: {side}: {note}")
    for side, counts in sorted(threads):
        print(f"note: {side} ran with torch threads {list(counts)}, not {report['threads']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="interleaved rounds (one run of each side) per size (7)")
    parser.add_argument("--sides", default=None,
                        help=f"comma-separated sides to time, {BASELINE} among them ({', '.join(RUNNERS)}; default: "
                             "all, the fabric, accelerate and lightning ones when their package imports)")
    parser.add_argument("--sizes", default="small,large", help="comma-separated: small, large (both)")
    parser.add_argument("--small-epochs", type=int, default=None, help=f"timed epochs, small ({SIZES['small'][5]})")
    parser.add_argument("--large-epochs", type=int, default=None, help=f"timed epochs, large ({SIZES['large'][5]})")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in every child (1)")
    parser.add_argument("--warmup-batches", type=int, default=4, help="untimed warm-up batches per process (4)")
    parser.add_argument("--log-every", type=int, default=50,
                        help="Trainer log_every, guard check_every, Lightning log_every_n_steps (50)")
    parser.add_argument("--seed", type=int, default=0, help="data, model, shuffle and run-order seed (0)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--child", choices=sorted(RUNNERS), help=argparse.SUPPRESS)
    parser.add_argument("--size", choices=sorted(SIZES), help=argparse.SUPPRESS)
    parser.add_argument("--epochs", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    args.command = " ".join([os.path.basename(sys.executable), os.path.relpath(__file__), *given])
    if min(args.repeats, args.threads, args.warmup_batches, args.log_every) < 1:
        parser.error("--repeats, --threads, --warmup-batches and --log-every must be at least 1")
    for name in ("small_epochs", "large_epochs", "epochs"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.child:
        if not args.size:
            parser.error("--child needs --size")
        child(args)
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
