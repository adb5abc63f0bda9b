"""The demo: a small CNN on the 8x8 handwritten digits shipped inside the package (no download)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from importlib import resources
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

DIGITS_ATTRIBUTION = (
    "8x8 digits: UCI Optical Recognition of Handwritten Digits (Alpaydin & Kaynak, 1998), CC BY 4.0"
)


def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """All 1,797 digits as float images in [0, 1] of shape (N, 1, 8, 8) and int64 labels."""
    with resources.files("trainwise").joinpath("demo/digits.npz").open("rb") as handle:
        arrays = np.load(handle)
        images, labels = arrays["images"], arrays["labels"]
    x = torch.from_numpy(images.astype(np.float32) / 16.0).unsqueeze(1)
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y


def digits_datasets(
    seed: int = 0, *, val_fraction: float = 0.2, digits: Sequence[int] | None = None
) -> tuple[TensorDataset, TensorDataset]:
    """A train/validation split of the digits, fixed by ``seed``; ``digits`` keeps only those classes,
    relabelled 0..len(digits)-1 in the order given."""
    x, y = load_digits()
    if digits is not None:
        keep = torch.isin(y, torch.tensor(list(digits)))
        x, y = x[keep], y[keep]
        relabel = torch.full((10,), -1, dtype=torch.int64)
        relabel[torch.tensor(list(digits))] = torch.arange(len(digits))
        y = relabel[y]
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_val = round(len(y) * val_fraction)
    val, train = order[:n_val], order[n_val:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val])


class DigitsCNN(nn.Module):
    """Three 3x3 conv blocks with BatchNorm, then dropout and a linear head: about 60k parameters."""

    def __init__(self, num_classes: int = 10, width: int = 32, dropout: float = 0.2) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 8x8 -> 4x4
            nn.Conv2d(2 * width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(dropout), nn.Linear(2 * width, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def make_model(width: int = 32, dropout: float = 0.2) -> DigitsCNN:
    """Factory used by ``examples/digits.toml`` and ``trainwise export --demo``."""
    return DigitsCNN(width=width, dropout=dropout)


def make_data(seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """Factory used by ``examples/digits.toml``: (train, validation) datasets."""
    return digits_datasets(seed)


def run_demo(
    *,
    seed: int = 0,
    epochs: int = 12,
    workers: int = 0,
    run_dir: str | None = None,
    overwrite: bool = False,
    device: str = "auto",
    progress: str = "auto",
    batch_size: int = 64,
    lr: float = 3e-3,
) -> dict[str, Any]:
    """Train :class:`DigitsCNN` on the digits; returns the summary printed by ``trainwise demo --json``."""
    from trainwise.seeding import seed_everything
    from trainwise.trainer import Trainer

    started = time.perf_counter()
    seed_everything(seed)  # the model's initial weights depend on the seed too
    train_set, val_set = digits_datasets(seed)
    model = DigitsCNN()
    trainer = Trainer(
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        eval_batch_size=256,
        seed=seed,
        num_workers=workers,
        run_dir=run_dir,
        overwrite=overwrite,
        device=device,
        progress=progress,  # type: ignore[arg-type]
        scheduler=lambda opt: torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=lr, total_steps=epochs * -(-len(train_set) // batch_size)
        ),
    )
    result = trainer.fit(model, train_set, val_set)
    return {
        "val_accuracy": result.last.get("val_accuracy"),
        "val_loss": result.last.get("val_loss"),
        "train_loss": result.last.get("train_loss"),
        "epochs": len(result.history),
        "steps": result.steps,
        "seconds": round(time.perf_counter() - started, 3),
        "run_dir": str(result.run_dir),
        "device": result.device,
        "precision": result.precision,
        "stopped": result.stopped,
        "overfitting": result.overfitting.message() if result.overfitting else None,
        "model": model,
    }


def run_finetune_demo(
    *,
    seed: int = 0,
    epochs: int = 8,
    workers: int = 0,
    run_dir: str | None = None,
    overwrite: bool = False,
    device: str = "auto",
    progress: str = "auto",
) -> dict[str, Any]:
    """Pretrain on digits 0-4, then fine-tune a new head on digits 5-9 with the backbone frozen.

    Returns both phases' validation accuracy and whether the frozen BatchNorm statistics (running mean,
    running variance, batches tracked) and the frozen weights stayed bitwise unchanged.
    """
    from pathlib import Path

    from trainwise.freezing import freeze, frozen_norm_layers
    from trainwise.progress import plural
    from trainwise.runlog import default_run_dir
    from trainwise.seeding import seed_everything
    from trainwise.trainer import Trainer

    started = time.perf_counter()
    root = Path(run_dir) if run_dir else default_run_dir()
    seed_everything(seed)
    model = DigitsCNN(num_classes=5)
    options = dict(
        epochs=epochs, lr=3e-3, batch_size=64, eval_batch_size=256, seed=seed, num_workers=workers, device=device,
        progress=progress, overwrite=overwrite,
    )
    pre_train, pre_val = digits_datasets(seed, digits=range(5))
    _phase(1, f"pretrain the whole model on digits 0-4 ({plural(epochs, 'epoch')})", progress)
    pretrain = Trainer(run_dir=str(root / "pretrain"), **options).fit(model, pre_train, pre_val)  # type: ignore[arg-type]

    width = model.head[-1].in_features
    model.head = nn.Sequential(  # a new head for digits 5-9; the backbone keeps what it learnt on 0-4
        nn.Flatten(), nn.Linear(width, 128), nn.ReLU(), nn.Dropout(0.2), nn.Linear(128, 5)
    )
    freeze(model, "features")
    frozen = {k: v.detach().clone() for k, v in model.features.state_dict().items()}
    fine_train, fine_val = digits_datasets(seed, digits=range(5, 10))
    options.update(epochs=epochs + epochs // 2, lr=1e-2, batch_size=32)
    _phase(2, f"fine-tune a new head on digits 5-9, backbone frozen ({plural(options['epochs'], 'epoch')})",
           progress)
    finetune = Trainer(run_dir=str(root / "finetune"), **options).fit(model, fine_train, fine_val)  # type: ignore[arg-type]
    after = model.features.state_dict()
    changed = [k for k, v in frozen.items() if not torch.equal(v, after[k])]
    return {
        "pretrain_val_accuracy": pretrain.last.get("val_accuracy"),
        "finetune_val_accuracy": finetune.last.get("val_accuracy"),
        "frozen_norm_layers": [f"features.{n}" for n in frozen_norm_layers(model.features)],
        "frozen_unchanged": not changed,
        "changed": changed,
        "epochs": len(pretrain.history) + len(finetune.history),
        "seconds": round(time.perf_counter() - started, 3),
        "run_dir": str(root),
        "device": finetune.device,
        "model": model,
    }


def _phase(number: int, what: str, progress: str) -> None:
    """The heading of one phase of the fine-tuning demo (``phase 1/2: ...``), unless progress is off."""
    if progress != "off":
        print(f"phase {number}/2: {what}", flush=True)
