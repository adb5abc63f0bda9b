"""The same training as hand_written_loop.py, with the Trainer composing the same primitives.

    python examples/trainer_loop.py
    python examples/trainer_loop.py --epochs 1 --run-dir /tmp/run
"""

from __future__ import annotations

import argparse

import trainwise as tw
from trainwise.demo import DigitsCNN, digits_datasets


def main(epochs: int = 3, seed: int = 0, run_dir: str | None = None) -> dict[str, float]:
    tw.seed_everything(seed)  # the model's initial weights come from the seeded RNG
    train_set, val_set = digits_datasets(seed)
    trainer = tw.Trainer(
        epochs=epochs,
        lr=3e-3,
        batch_size=16,
        effective_batch=64,
        max_grad_norm=1.0,
        eval_batch_size=256,
        seed=seed,
        run_dir=run_dir,
    )
    result = trainer.fit(DigitsCNN(), train_set, val_set)
    return result.last


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-dir", default=None)
    args = parser.parse_args()
    main(args.epochs, args.seed, args.run_dir)
