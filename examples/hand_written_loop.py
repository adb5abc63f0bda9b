"""Your own loop, with trainwise primitives taken one at a time (each line says which fundamental it fixes).

It does what the Trainer does on the same inputs: tuple or dict batches, a model that returns logits or its
own loss, a sized or unsized data set, one process or many under torchrun; examples/trainer_loop.py is the
same run with the Trainer, and a test checks that both end with the same numbers.

    python examples/hand_written_loop.py            # 3 epochs on the bundled digits
    python examples/hand_written_loop.py --epochs 1
"""

from __future__ import annotations

import argparse

import trainwise as tw
from trainwise.demo import DigitsCNN, digits_datasets


def main(epochs: int = 3, seed: int = 0) -> dict[str, float]:
    tw.seed_everything(seed)  # 10: Python, NumPy, torch (the model's initial weights)
    device = tw.resolve_device("auto").device  # 1: cuda, then mps, then cpu
    precision = tw.resolve_precision("auto", device)  # 12: bf16 where supported, fp16 only with a scaler
    train_set, val_set = digits_datasets(seed)
    model = DigitsCNN().to(device)
    tw.seed_everything(seed)  # as Trainer.fit does: training draws the same numbers whatever came before
    # 10: seeded order, this process's shard under torchrun, resumable mid-epoch, the last batch known
    train = tw.training_loader(train_set, batch_size=16, seed=seed, device=device, epochs=epochs)
    val = tw.evaluation_loader(val_set, batch_size=256, seed=seed, device=device)
    optimizer = tw.build_optimizer(model, lr=3e-3)  # 6: AdamW, no weight decay on biases and norms
    # 7: effective batch 64 from micro-batches of 16, gradients equal to one batch of 64
    accumulator = tw.GradientAccumulator(
        optimizer, steps=tw.accumulation_steps(64, 16), scaler=precision.make_scaler(), max_grad_norm=1.0
    )
    metrics = tw.MetricSet(device)  # 5 and 9: sums and counts on the device, read once per epoch

    def forward(model, batch):  # dict batches whole, labels= for models that take them, their own loss
        return tw.forward_micro_batch(model, batch, device=device, autocast=precision.autocast)

    values: dict[str, float] = {}
    for epoch in range(1, epochs + 1):
        model.train()
        metrics.reset()
        tw.set_sampler_epoch(train, epoch)  # a new order each epoch, the same on every process
        for batch, last_batch in train.with_last():  # no len() needed
            last = accumulator.ends_window(last=last_batch)
            with accumulator.sync_context(model, last=last):  # DDP: one gradient all-reduce per window
                micro = forward(model, batch)
                if micro.loss is None:  # nothing counted (every token ignored, a zero-row padding batch)
                    accumulator.backward_empty(micro.outputs)
                else:
                    accumulator.backward(micro.loss, count=micro.count, reduction=micro.reduction)
            metrics.mean("loss").update_loss(micro.loss, micro.count, micro.reduction)
            metrics.accuracy("accuracy").update(micro.outputs, micro.targets)
            if last:
                accumulator.step()  # normalise, unscale, clip, step, zero_grad(set_to_none=True)
        train_values = tw.global_metric_values(metrics)  # one host sync, summed over processes
        # 4: eval() + inference_mode(), each module's mode restored; loss and accuracy counted by sample
        values = tw.evaluate(model, val, forward, device=device)
        print(
            f"epoch {epoch}: train loss {train_values['loss']:.4f} acc {train_values['accuracy']:.4f} | "
            f"val loss {values['loss']:.4f} acc {values['accuracy']:.4f}"
        )
    return values


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    main(args.epochs, args.seed)
