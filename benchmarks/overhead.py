"""Per-step overhead of the Trainer against a hand-written loop doing the same work.

Both sides train the same MLP (same seed, so the same initial weights) on the same synthetic data with
AdamW (same lr and weight decay, none on biases as in the Trainer's default groups), shuffled by a sampler
with the same seeded generator, batch by batch: forward, cross-entropy, backward, optimizer step,
``zero_grad(set_to_none=True)``, and a running sample-weighted loss and accuracy kept as tensors and read
once per epoch. The Trainer runs on CPU in fp32 with ``progress="off"``, no validation, no checkpoints and
no learning-curve plot (one-off costs per epoch and per run, which would dominate these 50 ms epochs), and
its run folder in a temporary directory; on top of that work it does what it always does per step
(non-finite-loss guard, exact accumulation, a log line every ``log_every`` steps, the runtime guards unless
``guards="off"``).

Four sides: ``hand`` (the baseline loop), ``guard`` (the same loop inside ``trainwise.guard(model, optimizer)``),
``trainer`` (the Trainer as shipped, runtime guards on) and ``trainer-noguards`` (``guards="off"``).
Every measurement runs in a fresh process (``--child``) that builds the data and model, warms up on a few
batches with the same code, then times one whole run (``fit`` for the Trainer; the loop plus its optimizer
and DataLoader for the hand-written side) and prints one JSON line. The parent interleaves the sides,
in a random order within each pair, and reports per optimizer step the median and the spread (min-max) of
wall time and of process CPU time (steadier when other processes share the cores), the ratio of the
medians, and the median and range of the per-pair ratios. Both sides report their final training loss:
equal losses show that they did the same work.

    python benchmarks/overhead.py                      # both sizes, 7 rounds each (about 6 minutes on 2 cores)
    python benchmarks/overhead.py --sizes small --repeats 11 --json
    python benchmarks/overhead.py --sides hand,trainer  # only these sides

Nothing here asserts a time: the numbers mean something only as ratios within one run, on one machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

# name: (in_features, hidden layer widths, classes, samples, batch size, default epochs)
SIZES: dict[str, tuple[int, tuple[int, ...], int, int, int, int]] = {
    "small": (32, (64,), 10, 4096, 64, 10),  # 64 steps/epoch; per-step overhead dominates
    "large": (512, (2048, 2048), 10, 4096, 256, 1),  # 16 steps/epoch; compute dominates
}
LR = 1e-3
WEIGHT_DECAY = 0.01


# -- child: one timed run in this process --------------------------------------------------------------


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


def _run_trainer(
    model: Any, dataset: Any, *, epochs: int, batch_size: int, seed: int, log_every: int, guards: str = "warn"
) -> dict:
    from trainwise import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(
            epochs=epochs,
            lr=LR,
            weight_decay=WEIGHT_DECAY,
            batch_size=batch_size,
            device="cpu",
            precision="fp32",
            seed=seed,
            progress="off",
            log_every=log_every,
            run_dir=os.path.join(tmp, "run"),
            guards=guards,
            # one-off costs, not per step: the epoch-end checkpoint (a few ms per save) and the final
            # learning-curve PNG (about 0.2 s with matplotlib) would dominate these 50 ms epochs
            checkpoints=False,
            plot=False,
        )
        started, cpu_started = time.perf_counter(), time.process_time()
        result = trainer.fit(model, dataset, val_data=None)
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    return {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "steps": result.steps,
        "loss": result.last["train_loss"],
        "accuracy": result.last["train_accuracy"],
    }


def _run_hand(
    model: Any, dataset: Any, *, epochs: int, batch_size: int, seed: int, log_every: int, guarded: bool = False
) -> dict:
    import contextlib

    import torch
    from torch.utils.data import DataLoader, RandomSampler

    started, cpu_started = time.perf_counter(), time.process_time()
    # no weight decay on biases, as the Trainer's default parameter groups (same work, same final loss)
    decay = [p for name, p in model.named_parameters() if not name.endswith("bias")]
    no_decay = [p for name, p in model.named_parameters() if name.endswith("bias")]
    groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=LR, weight_decay=WEIGHT_DECAY)
    guarding: Any = contextlib.nullcontext()
    if guarded:  # the same loop with trainwise's runtime guards around it (reads the device every log_every)
        import trainwise

        guarding = trainwise.guard(model, optimizer, check_every=log_every)
    # A seeded shuffling sampler, as trainwise.seeding.seeded_loader builds it, so that both sides see the
    # batches in the same order (the final losses then match; shuffle=True costs the same per step).
    sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    steps = 0
    loss_value = accuracy_value = float("nan")
    with guarding:
        loss_value, accuracy_value, steps = _hand_epochs(model, optimizer, loader, epochs)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    return {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "steps": steps,
        "loss": loss_value,
        "accuracy": accuracy_value,
    }


def _hand_epochs(model: Any, optimizer: Any, loader: Any, epochs: int) -> tuple[float, float, int]:
    """The minimal loop a user would write: metrics as tensors, read once per epoch."""
    import torch
    import torch.nn.functional as F

    steps = 0
    loss_value = accuracy_value = float("nan")
    for _ in range(epochs):
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
            steps += 1
        loss_value, accuracy_value = total_loss.item() / seen, correct.item() / seen
    return loss_value, accuracy_value, steps


def _run_hand_guarded(model: Any, dataset: Any, **options: Any) -> dict:
    return _run_hand(model, dataset, guarded=True, **options)


def _run_trainer_unguarded(model: Any, dataset: Any, **options: Any) -> dict:
    return _run_trainer(model, dataset, guards="off", **options)


# hand: the baseline; guard: the same loop inside trainwise.guard(); trainer: the Trainer as shipped (guards on);
# trainer-noguards: the Trainer with guards="off"
RUNNERS = {"hand": _run_hand, "guard": _run_hand_guarded, "trainer": _run_trainer,
           "trainer-noguards": _run_trainer_unguarded}


def child(args: argparse.Namespace) -> None:
    import torch
    from torch.utils.data import Subset

    torch.set_num_threads(args.threads)
    _, _, _, _, batch_size, default_epochs = SIZES[args.size]
    epochs = args.epochs or default_epochs
    dataset = _data(args.size, args.seed)
    run = RUNNERS[args.child]
    # Warm-up: the same code on a throwaway model and a few batches (allocator, kernels, first-call paths).
    warmup = Subset(dataset, range(min(len(dataset), args.warmup_batches * batch_size)))
    run(_model(args.size, args.seed), warmup, epochs=1, batch_size=batch_size, seed=args.seed, log_every=args.log_every)
    measured = run(
        _model(args.size, args.seed),
        dataset,
        epochs=epochs,
        batch_size=batch_size,
        seed=args.seed,
        log_every=args.log_every,
    )
    measured.update(
        side=args.child,
        size=args.size,
        threads=torch.get_num_threads(),
        per_step=measured["seconds"] / measured["steps"],
        cpu_per_step=measured["cpu_seconds"] / measured["steps"],
    )
    print(json.dumps(measured), flush=True)


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
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"child {side}/{size} failed (exit {done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _summary(values: list[float]) -> dict[str, float]:
    median = statistics.median(values)
    return {"median": median, "min": min(values), "max": max(values), "spread": (max(values) - min(values)) / median}


CLOCKS = {"wall": "per_step", "cpu": "cpu_per_step"}  # cpu: process CPU time, less sensitive to a busy machine


def parent(args: argparse.Namespace) -> int:
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    for size in sizes:
        if size not in SIZES:
            raise SystemExit(f"unknown size {size!r}; choose from {', '.join(SIZES)}.")
    order = random.Random(args.seed)
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if "hand" not in sides or any(side not in RUNNERS for side in sides):
        raise SystemExit(f"--sides must include hand and only these: {', '.join(RUNNERS)}.")
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
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "repeats": args.repeats,
        "threads": args.threads,
        "seed": args.seed,
        "log_every": args.log_every,
        "load_average_1min": [load_before, os.getloadavg()[0] if load_before is not None else None],
        "seconds": time.perf_counter() - started,
        "sizes": {},
    }
    for size in sizes:
        hand = runs[size]["hand"]
        features, hidden, classes, samples, batch_size, _ = SIZES[size]
        entry: dict[str, Any] = {
            "model": "-".join(map(str, (features, *hidden, classes))),
            "samples": samples,
            "batch_size": batch_size,
            "steps": hand[0]["steps"],
            # Same seed, same data order, same optimizer: every side should end at the same loss.
            "final_loss": {side: runs[size][side][0]["loss"] for side in sides},
            "final_accuracy": {side: runs[size][side][0]["accuracy"] for side in sides},
            "same_result": all(math.isclose(hand[0]["loss"], runs[size][side][0]["loss"], rel_tol=1e-4,
                                            abs_tol=1e-6) for side in sides),
        }
        for clock, key in CLOCKS.items():
            h = _summary([r[key] for r in hand])
            entry[clock] = {"hand": h}
            for side in sides[1:] if sides[0] == "hand" else [x for x in sides if x != "hand"]:
                t = _summary([r[key] for r in runs[size][side]])
                entry[clock][side] = {
                    **t,
                    "ratio": t["median"] / h["median"],
                    "pair_ratio": _summary([b[key] / a[key] for a, b in zip(hand, runs[size][side])]),
                }
        report["sizes"][size] = entry

    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    _print_table(report)
    return 0


def _print_table(report: dict[str, Any]) -> None:
    def cell(s: dict[str, float]) -> str:
        return f"{s['median'] * 1e3:.3f} [{s['min'] * 1e3:.3f}-{s['max'] * 1e3:.3f}]"

    load = report["load_average_1min"]
    print(
        f"\nTrainer and guards vs a hand-written loop: {report['repeats']} interleaved rounds of fresh processes per "
        f"size, {report['threads']} thread(s), CPU fp32, log_every {report['log_every']}"
    )
    if load[0] is not None:
        print(f"load average (1 min) before/after: {load[0]:.2f}/{load[1]:.2f}; took {report['seconds']:.0f} s")
    print("ms per optimizer step, median [min-max]; ratio = median(side) / median(hand)\n")
    print(f"{'size':<6} {'clock':<5} {'side':<17} {'ms/step':<27} {'ratio':>6}  per-round ratio [min-max]")
    for size, e in report["sizes"].items():
        for clock in CLOCKS:
            print(f"{size:<6} {clock:<5} {'hand':<17} {cell(e[clock]['hand']):<27}")
            for side, c in e[clock].items():
                if side == "hand":
                    continue
                p = c["pair_ratio"]
                print(f"{size:<6} {clock:<5} {side:<17} {cell(c):<27} {c['ratio']:>6.3f}  "
                      f"{p['median']:.3f} [{p['min']:.3f}-{p['max']:.3f}]")
    print("\ntargets on the small model: trainer <= 1.05, guard <= 1.02")
    for size, e in report["sizes"].items():
        losses = ", ".join(f"{side} {loss:.6f}" for side, loss in e["final_loss"].items())
        verdict = "match" if e["same_result"] else "DIFFER: the sides no longer do the same work"
        print(f"same work ({size}): final train loss {losses}: {verdict}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="interleaved rounds (one run of each side) per size (7)")
    parser.add_argument("--sides", default=",".join(RUNNERS),
                        help=f"comma-separated sides to time, hand first ({', '.join(RUNNERS)})")
    parser.add_argument("--sizes", default="small,large", help="comma-separated: small, large (both)")
    parser.add_argument("--small-epochs", type=int, default=None, help=f"timed epochs, small ({SIZES['small'][5]})")
    parser.add_argument("--large-epochs", type=int, default=None, help=f"timed epochs, large ({SIZES['large'][5]})")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in every child (1)")
    parser.add_argument("--warmup-batches", type=int, default=4, help="untimed warm-up batches per process (4)")
    parser.add_argument("--log-every", type=int, default=50, help="Trainer log_every (50)")
    parser.add_argument("--seed", type=int, default=0, help="data, model, shuffle and run-order seed (0)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--child", choices=sorted(RUNNERS), help=argparse.SUPPRESS)
    parser.add_argument("--size", choices=sorted(SIZES), help=argparse.SUPPRESS)
    parser.add_argument("--epochs", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.repeats, args.threads, args.warmup_batches, args.log_every) < 1:
        parser.error("--repeats, --threads, --warmup-batches and --log-every must be at least 1")
    if args.child:
        if not args.size:
            parser.error("--child needs --size")
        child(args)
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
