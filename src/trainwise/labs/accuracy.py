"""Fundamental 5: accuracy is a fraction of samples, so ``correct / len(loader)`` (batches) is wrong."""

from __future__ import annotations

from trainwise.labs import Lab, LabResult


def measure() -> LabResult:
    import torch
    from torch.utils.data import DataLoader

    from trainwise.demo import DigitsCNN, digits_datasets

    torch.manual_seed(0)
    train, val = digits_datasets(0)
    model = DigitsCNN(width=8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for inputs, targets in DataLoader(train, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0)):
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
    figures = {}
    model.eval()
    for batch_size in (1, 16, 64):
        loader = DataLoader(val, batch_size=batch_size)
        correct = 0
        with torch.inference_mode():
            for inputs, targets in loader:
                correct += int((model(inputs).argmax(1) == targets).sum())
        figures[f"batch {batch_size}: correct / len(loader)"] = correct / len(loader)  # noqa: TW101 (the wrong way, measured on purpose)
        figures[f"batch {batch_size}: correct / len(dataset)"] = correct / len(loader.dataset)
    right = figures["batch 64: correct / len(dataset)"]
    wrong = figures["batch 64: correct / len(loader)"]
    reading = (f"Dividing by the number of batches reports {wrong:.2f} at batch size 64 for a model whose accuracy is "
               f"{right:.4f}: the number of batches is about the number of samples over the batch size, so the "
               "wrong figure is about batch-size times too large (and right only at batch size 1).")
    same = all(figures[f"batch {b}: correct / len(dataset)"] == right for b in (1, 16, 64))
    return LabResult(figures=figures, reading=reading, shown=same and wrong > 10 * right and 0 < right <= 1)


LAB = Lab(name="accuracy", fundamental=5, title="accuracy over batches vs over samples", codes=("TW101",),
          measure=measure)
