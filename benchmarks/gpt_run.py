"""A realistic run: a small GPT-style decoder trained for a few epochs with an evaluation and a checkpoint each
epoch, ``Trainer`` with its defaults against the loop a user writes to do the same work, in fresh processes.

The model (written here): token and position embeddings, ``--layers`` pre-norm blocks (causal self-attention
through ``F.scaled_dot_product_attention``, a 4x GELU MLP, residuals), a final LayerNorm and a linear head;
sequences of 128 tokens. The data: synthetic token sequences drawn from a fixed random Markov chain (each token
prefers a few successors), so the loss falls; made here from a seed, nothing downloaded. Both sides:

- start from the same weights (built under the same seed) and see the batches in the same order (a
  ``RandomSampler`` with the same seeded generator, as the Trainer's own loader draws them);
- use the same optimizer, ``torch.optim.AdamW(params, lr, weight_decay=0)``, given to the Trainer as its
  ``optimizer`` factory (a factory gets the Trainer's parameter groups, no weight decay on biases and norms;
  with no weight decay at all they fold back into the one group the hand loop has), and the same loss, the mean
  cross-entropy of the next token;
- each epoch, evaluate the validation loss and token accuracy under eval mode and inference mode, and save the
  model's and the optimizer's state with ``torch.save``.

``hand`` is that loop as a user writes it (the running training loss kept as a tensor and read once per epoch);
``trainer`` is ``Trainer(...).fit(model, train, val)`` with every other option at its default (run folder and log,
progress lines, the guards, train accuracy, checkpoints that also hold the RNG and loader state, the curves, the
diagnosis). Each measurement is a fresh process that warms up on a throwaway run of its side (imports, first
calls), then times the whole run: from before the optimizer (or Trainer) is built to the end of the last epoch's
checkpoint. The sides run interleaved, in a random order each round; the report gives the medians, their spread
(min-max), and the per-round ratio trainer / hand (median and range), in process CPU time (steadier on a shared
machine) and wall time, against the target of 1.02. Each side reports its final validation loss: the two must
agree (1e-4 relative), or they no longer do the same work.

    python benchmarks/gpt_run.py               # 7 rounds, 3 epochs (about 4 minutes on 2 cores)
    python benchmarks/gpt_run.py --quick       # 1 round of a tiny run: checks that it works (a test runs it)
    python benchmarks/gpt_run.py --repeats 11 --json

Nothing here asserts a time: the numbers mean something only as ratios within one run, on one machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from typing import Any

import rounds

SIDES = ("hand", "trainer")
TARGET = 1.02  # trainer / hand, whole run, per-round ratio median
RESULT_MARK = "GPT_RUN_RESULT "
CLOCKS = ("cpu", "wall")
LOSS_TOLERANCE = 1e-4


@dataclasses.dataclass(frozen=True)
class Shape:
    vocab: int = 256
    width: int = 64
    heads: int = 4
    layers: int = 4
    seq: int = 128
    batch: int = 8
    train_batches: int = 32  # per epoch
    val_batches: int = 8
    epochs: int = 3
    lr: float = 1e-3
    weight_decay: float = 0.0  # the Trainer hands a factory no-decay groups; with none they fold back into one
    seed: int = 0


QUICK = Shape(width=32, heads=2, layers=2, seq=128, batch=4, train_batches=3, val_batches=2, epochs=2)


# -- the model and the data ------------------------------------------------------------------------------------


def build_model(shape: Shape) -> Any:
    """A small decoder-only transformer, its weights drawn under ``shape.seed``."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(shape.width), nn.LayerNorm(shape.width)
            self.qkv = nn.Linear(shape.width, 3 * shape.width)
            self.out = nn.Linear(shape.width, shape.width)
            self.mlp = nn.Sequential(nn.Linear(shape.width, 4 * shape.width), nn.GELU(),
                                     nn.Linear(4 * shape.width, shape.width))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            batch, length, width = x.shape
            q, k, v = self.qkv(self.norm1(x)).split(width, dim=-1)
            q, k, v = (t.view(batch, length, shape.heads, width // shape.heads).transpose(1, 2) for t in (q, k, v))
            attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.out(attended.transpose(1, 2).reshape(batch, length, width))
            return x + self.mlp(self.norm2(x))

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tokens = nn.Embedding(shape.vocab, shape.width)
            self.positions = nn.Embedding(shape.seq, shape.width)
            self.blocks = nn.ModuleList(Block() for _ in range(shape.layers))
            self.norm = nn.LayerNorm(shape.width)
            self.head = nn.Linear(shape.width, shape.vocab, bias=False)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            x = self.tokens(tokens) + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    torch.manual_seed(shape.seed)
    return Decoder()


def make_data(shape: Shape) -> tuple[Any, Any]:
    """Training and validation sets of (tokens, next tokens), sampled from one seeded Markov chain."""
    import torch
    from torch.utils.data import TensorDataset

    generator = torch.Generator().manual_seed(shape.seed)
    # each token strongly prefers 4 successors: a pattern a small model learns within a few epochs
    logits = torch.randn(shape.vocab, shape.vocab, generator=generator)
    favourites = torch.randint(0, shape.vocab, (shape.vocab, 4), generator=generator)
    logits.scatter_add_(1, favourites, torch.full((shape.vocab, 4), 4.0))
    transitions = logits.softmax(dim=1)

    def sequences(count: int) -> torch.Tensor:
        tokens = torch.empty(count, shape.seq + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, shape.vocab, (count,), generator=generator)
        for position in range(shape.seq):
            tokens[:, position + 1] = torch.multinomial(transitions[tokens[:, position]], 1,
                                                        generator=generator).squeeze(1)
        return tokens

    train, val = sequences(shape.train_batches * shape.batch), sequences(shape.val_batches * shape.batch)
    return TensorDataset(train[:, :-1], train[:, 1:]), TensorDataset(val[:, :-1], val[:, 1:])


def next_token_loss(logits: Any, targets: Any) -> Any:
    """The mean cross-entropy of every next token."""
    import torch.nn.functional as F

    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def make_optimizer(params: Any, shape: Shape) -> Any:
    import torch

    return torch.optim.AdamW(params, lr=shape.lr, weight_decay=shape.weight_decay)


# -- the two sides --------------------------------------------------------------------------------------------


def run_hand(model: Any, train: Any, val: Any, shape: Shape, folder: str) -> float:
    """The loop a user writes for the same work; returns the last validation loss."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    optimizer = make_optimizer(model.parameters(), shape)
    sampler = RandomSampler(train, generator=torch.Generator().manual_seed(shape.seed))
    loader = DataLoader(train, batch_size=shape.batch, sampler=sampler)
    val_loader = DataLoader(val, batch_size=shape.batch)
    val_loss = math.nan
    for epoch in range(1, shape.epochs + 1):
        model.train()
        running = torch.zeros(())
        for inputs, targets in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = next_token_loss(model(inputs), targets)
            loss.backward()
            optimizer.step()
            running += loss.detach()
        model.eval()
        total, correct, tokens = torch.zeros(()), torch.zeros((), dtype=torch.long), 0
        with torch.inference_mode():
            for inputs, targets in val_loader:
                logits = model(inputs)
                total += next_token_loss(logits, targets) * targets.numel()
                correct += (logits.argmax(dim=-1) == targets).sum()
                tokens += targets.numel()
        val_loss = total.item() / tokens
        print(f"epoch {epoch}: train_loss {running.item() / len(loader):.4f} val_loss {val_loss:.4f} "
              f"val_accuracy {correct.item() / tokens:.4f}")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                   os.path.join(folder, f"epoch-{epoch}.pt"))
    return val_loss


def run_trainer(model: Any, train: Any, val: Any, shape: Shape, folder: str) -> float:
    """``Trainer`` with its defaults, given the same optimizer and loss; returns the last validation loss."""
    from trainwise import Trainer

    trainer = Trainer(epochs=shape.epochs, batch_size=shape.batch, seed=shape.seed, device="cpu", precision="fp32",
                      optimizer=lambda params: make_optimizer(params, shape), loss_fn=next_token_loss,
                      run_dir=os.path.join(folder, "run"))
    return trainer.fit(model, train, val).history[-1]["val_loss"]


RUNNERS = {"hand": run_hand, "trainer": run_trainer}


# -- child: one timed run in a fresh process -----------------------------------------------------------------


def child(side: str, shape: Shape, threads: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    train, val = make_data(shape)
    run = RUNNERS[side]
    warm = dataclasses.replace(shape, epochs=1)
    with tempfile.TemporaryDirectory() as folder:  # warm-up: imports and first calls, on a throwaway model
        run(build_model(shape), torch.utils.data.Subset(train, range(2 * shape.batch)),
            torch.utils.data.Subset(val, range(shape.batch)), warm, folder)
    model = build_model(shape)
    with tempfile.TemporaryDirectory() as folder:
        wall, cpu = time.perf_counter(), time.process_time()
        val_loss = run(model, train, val, shape, folder)
        seconds = {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}
    steps = shape.epochs * shape.train_batches
    return {"side": side, "run": seconds, "val_loss": val_loss, "steps": steps, "threads": torch.get_num_threads()}


def _spawn(side: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, os.path.abspath(__file__), "--child", side, "--threads", str(args.threads),
               "--epochs", str(args.epochs), *(["--quick"] if args.quick else [])]
    return rounds.child_result(command, threads=args.threads, mark=RESULT_MARK, label=side)


# -- parent: interleaved rounds, medians, spread, ratios ------------------------------------------------------


def parent(args: argparse.Namespace, shape: Shape) -> dict[str, Any]:
    runs, load, seconds = rounds.interleaved(list(SIDES), args.repeats, shape.seed, lambda side: _spawn(side, args),
                                             quiet=args.json)
    hand, trainer = runs["hand"], runs["trainer"]
    losses = [r["val_loss"] for side in SIDES for r in runs[side]]
    reference = hand[0]["val_loss"]
    return {
        "shape": dataclasses.asdict(shape), "repeats": args.repeats, "threads": args.threads, "quick": args.quick,
        "load_average_1min": load, "seconds": seconds, "steps": hand[0]["steps"],
        "sides": {side: {clock: rounds.summary([r["run"][clock] for r in rs]) for clock in CLOCKS}
                  for side, rs in runs.items()},
        "ratio": {clock: rounds.summary([t["run"][clock] / h["run"][clock] for t, h in zip(trainer, hand)])
                  for clock in CLOCKS},
        "val_loss": {side: rs[0]["val_loss"] for side, rs in runs.items()},
        "same_result": all(math.isclose(loss, reference, rel_tol=LOSS_TOLERANCE) for loss in losses),
        "target": TARGET,
    }


def _print(report: dict[str, Any]) -> None:
    shape, load = report["shape"], report["load_average_1min"]
    print(f"\nGPT-style decoder: {shape['layers']} layers, width {shape['width']}, {shape['heads']} heads, vocab "
          f"{shape['vocab']}, sequence {shape['seq']}, batch {shape['batch']}; {shape['epochs']} epochs of "
          f"{shape['train_batches']} steps, evaluation ({shape['val_batches']} batches) and a checkpoint each epoch")
    print(f"{report['repeats']} interleaved round(s) of fresh processes, {report['threads']} thread(s), CPU fp32")
    if load:
        print(f"load average (1 min) before/after: {load[0]:.2f}/{load[1]:.2f}; took {report['seconds']:.0f} s")
    for clock in CLOCKS:
        hand, trainer = report["sides"]["hand"][clock], report["sides"]["trainer"][clock]
        ratio = report["ratio"][clock]
        per_step = hand["median"] / report["steps"] * 1e3
        print(f"{clock:<5} hand {hand['median']:.3f} s [{hand['min']:.3f}-{hand['max']:.3f}] ({per_step:.1f} ms a step)"
              f"  trainer {trainer['median']:.3f} s [{trainer['min']:.3f}-{trainer['max']:.3f}]"
              f"  ratio per round {ratio['median']:.3f} [{ratio['min']:.3f}-{ratio['max']:.3f}]")
    verdict = "met" if report["ratio"]["cpu"]["median"] <= report["target"] else "NOT met"
    print(f"target: trainer / hand <= {report['target']:.2f} for the whole run (cpu, per-round median): {verdict}")
    losses = ", ".join(f"{side} {loss:.6f}" for side, loss in report["val_loss"].items())
    print(f"same result (last validation loss): {losses}: "
          f"{'match' if report['same_result'] else 'DIFFER: the sides no longer do the same work'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=None, help="interleaved rounds (7; 1 with --quick)")
    parser.add_argument("--epochs", type=int, default=None, help=f"timed epochs ({Shape.epochs})")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in every child (1)")
    parser.add_argument("--quick", action="store_true", help="a tiny model and run, one round: checks that it works")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (1 if args.quick else 7)
    if min(args.repeats, args.threads, args.epochs or 1) < 1:
        parser.error("--repeats, --threads and --epochs must be at least 1")
    shape = QUICK if args.quick else Shape()
    if args.epochs:
        shape = dataclasses.replace(shape, epochs=args.epochs)
    args.epochs = shape.epochs
    if args.child:
        print(RESULT_MARK + json.dumps(child(args.child, shape, args.threads)), flush=True)
        return 0
    report = parent(args, shape)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
