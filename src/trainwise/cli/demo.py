"""``trainwise demo``: train the small CNN on the digits shipped inside the package."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from trainwise.run_folder import LOG


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "demo",
        help="train a small CNN on the bundled 8x8 digits",
        description="Train a small CNN on the 8x8 handwritten digits shipped inside trainwise (no download).",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for the split, weights and data order")
    parser.add_argument("--epochs", type=int, default=12, help="passes over the training set (default 12)")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes (default 0)")
    parser.add_argument("--run-dir", default=None, help="run folder (default runs/<date>-<time>)")
    parser.add_argument("--overwrite", action="store_true",
                        help="move a run already in --run-dir aside (never deleted) instead of refusing")
    parser.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda, mps")
    parser.add_argument("--json", action="store_true", help="print one JSON summary as the last line")
    parser.add_argument(
        "--finetune",
        action="store_true",
        help="pretrain on digits 0-4, then fine-tune a new head on 5-9 with the backbone frozen",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from trainwise.cli import interrupted
    from trainwise.errors import TrainwiseError
    from trainwise.interrupts import Preempted

    if args.epochs < 1:
        raise TrainwiseError(f"--epochs must be at least 1, got {args.epochs}.")
    if args.workers < 0:
        raise TrainwiseError(f"--workers must be 0 or more, got {args.workers}.")
    from trainwise.demo import DIGITS_ATTRIBUTION, run_demo, run_finetune_demo  # torch: after the cheap checks
    if not args.json:
        print(f"trainwise demo: {DIGITS_ATTRIBUTION}")
    runner = run_finetune_demo if args.finetune else run_demo
    try:
        summary = runner(
            seed=args.seed,
            epochs=min(args.epochs, 8) if args.finetune else args.epochs,
            workers=args.workers,
            run_dir=args.run_dir,
            overwrite=args.overwrite,
            device=args.device,
            progress="off" if args.json else "auto",
        )
    except KeyboardInterrupt as exc:  # Ctrl-C: the Trainer saved the log and a checkpoint, then re-raised
        result = getattr(exc, "result", None)
        if result is None:
            raise
        if args.json:
            from trainwise.cli.fit import summarize

            print(json.dumps(summarize(result)), flush=True)
        return interrupted("demo", result.run_dir)
    except Preempted as exc:  # SIGTERM: the Trainer saved the log and a checkpoint; exit code 143
        from trainwise.cli.fit import preempted, summarize

        if args.json:
            print(json.dumps(summarize(exc.result)), flush=True)
        return preempted("demo", exc.result.run_dir)
    summary.pop("model")
    if summary.get("stopped") == "interrupted":  # a Trainer that returns its result on Ctrl-C
        if args.json:
            print(json.dumps(summary), flush=True)
        return interrupted("demo", summary["run_dir"])
    if args.json:
        print(json.dumps(summary))
    elif args.finetune:
        verdict = "unchanged (bitwise)" if summary["frozen_unchanged"] else f"CHANGED: {summary['changed']}"
        print(
            f"pretrain on 0-4: validation accuracy {summary['pretrain_val_accuracy']:.4f}; fine-tune on 5-9 with "
            f"the backbone frozen: {summary['finetune_val_accuracy']:.4f}. Frozen weights and BatchNorm "
            f"statistics ({', '.join(summary['frozen_norm_layers'])}): {verdict}."
        )
    else:
        print(
            f"validation accuracy {summary['val_accuracy']:.4f}, loss {summary['val_loss']:.4f} after "
            f"{summary['epochs']} epochs in {summary['seconds']:.1f} s on {summary['device']}; "
            f"log in {os.path.join(summary['run_dir'], LOG)}"
        )
    return 0 if summary.get("frozen_unchanged", True) else 1
