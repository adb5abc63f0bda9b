"""Your own loop, with trainwise primitives taken one at a time (each line says which fundamental it fixes).

    python examples/hand_written_loop.py            # 3 epochs on the bundled digits
    python examples/hand_written_loop.py --epochs 1
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import trainwise as tw
from trainwise.demo import DigitsCNN, digits_datasets


def main(epochs: int = 3, seed: int = 0) -> dict[str, float]:
    tw.seed_everything(seed)  # 10: Python, NumPy, torch
    device = tw.resolve_device("auto").device  # 1: cuda, then mps, then cpu
    precision = tw.resolve_precision("auto", device)  # 12: bf16 where supported, fp16 only with a scaler
    train_set, val_set = digits_datasets(seed)
    train_loader = tw.seeded_loader(train_set, batch_size=16, seed=seed, num_workers=0)  # 10: seeded order
    val_loader = torch.utils.data.DataLoader(val_set, batch_size=256)

    model = DigitsCNN().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    # 7: effective batch 64 from micro-batches of 16, gradients equal to one batch of 64
    accumulator = tw.GradientAccumulator(
        optimizer, steps=tw.accumulation_steps(64, 16), scaler=precision.make_scaler(), max_grad_norm=1.0
    )
    metrics = tw.MetricSet(device)  # 5 and 9: sums and counts on the device, read once per epoch
    val = {}
    for epoch in range(1, epochs + 1):
        model.train()
        metrics.reset()
        for i, (x, y) in enumerate(train_loader):
            x, y = tw.move_to_device((x, y), device)
            with precision.autocast():
                logits = model(x)
                loss = F.cross_entropy(logits, y)
            accumulator.backward(loss, count=len(y))
            metrics.mean("loss").update(loss, len(y))
            metrics.accuracy("accuracy").update(logits, y)
            if accumulator.window_full or i == len(train_loader) - 1:
                accumulator.step()  # normalise, unscale, clip, step, zero_grad(set_to_none=True)
        train = metrics.compute()

        metrics.reset()
        with tw.evaluating(model):  # 4: eval() + inference_mode(), each module's mode restored
            for x, y in val_loader:
                x, y = tw.move_to_device((x, y), device)
                logits = model(x)
                metrics.mean("loss").update(F.cross_entropy(logits, y), len(y))
                metrics.accuracy("accuracy").update(logits, y)
        val = metrics.compute()
        print(
            f"epoch {epoch}: train loss {train['loss']:.4f} acc {train['accuracy']:.4f} | "
            f"val loss {val['loss']:.4f} acc {val['accuracy']:.4f}"
        )
    return val


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    main(args.epochs, args.seed)
