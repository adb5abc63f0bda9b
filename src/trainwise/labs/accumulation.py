"""Fundamental 7: accumulated gradients must equal the full batch's; ``loss / k`` is wrong whenever micro-batches
differ in size (a short last window) or a loss averages over tokens."""

from __future__ import annotations

from trainwise.labs import Lab, LabResult


def _relative_error(grads, reference) -> float:
    import torch

    num = torch.sqrt(sum(((g - r) ** 2).sum() for g, r in zip(grads, reference)))
    den = torch.sqrt(sum((r**2).sum() for r in reference))
    return float(num / den)


def measure() -> LabResult:
    import torch
    import torch.nn.functional as F

    from trainwise.accumulation import GradientAccumulator

    g = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(20, 16), torch.nn.Linear(16, 20))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    params = list(model.parameters())

    def gradient(fn) -> list:
        model.zero_grad(set_to_none=True)
        fn()
        return [p.grad.detach().clone() for p in params]

    # samples: 10 sequences of 2 to 12 tokens (padding -100): micro-batches of 3 -> 3, 3, 3, 1 (a short last one)
    lengths = [2, 12, 5, 9, 3, 11, 4, 8, 6, 12]
    ids = torch.randint(0, 20, (10, 12), generator=g)
    labels = torch.where(torch.arange(12) < torch.tensor(lengths)[:, None], torch.randint(0, 20, (10, 12), generator=g),
                         torch.tensor(-100))
    micro = [slice(0, 3), slice(3, 6), slice(6, 9), slice(9, 10)]

    def loss(part, reduction="mean"):
        logits = model(ids[part])
        return F.cross_entropy(logits.reshape(-1, 20), labels[part].reshape(-1), ignore_index=-100,
                               reduction=reduction)

    def sample_loss(part):  # the mean over samples of each sample's mean token loss
        logits = model(ids[part])
        per_token = F.cross_entropy(logits.transpose(1, 2), labels[part], ignore_index=-100, reduction="none")
        return (per_token.sum(1) / (labels[part] != -100).sum(1)).mean()

    figures = {}
    for kind, full_loss, micro_loss, count in (
        ("samples", lambda: sample_loss(slice(0, 10)), sample_loss, lambda part: part.stop - part.start),
        ("tokens", lambda: loss(slice(0, 10)), loss, lambda part: int((labels[part] != -100).sum())),
    ):
        reference = gradient(lambda f=full_loss: f().backward())
        naive = gradient(lambda m=micro_loss: [(m(p) / len(micro)).backward() for p in micro])

        captured: list = []

        def capture(optimizer, args, kwargs, captured=captured):  # the gradients the step would apply
            captured.append([p.grad.detach().clone() for p in params])

        optimizer = torch.optim.SGD(params, lr=0.0)
        optimizer.register_step_pre_hook(capture)
        accumulator = GradientAccumulator(optimizer, steps=len(micro))
        model.zero_grad(set_to_none=True)
        for part in micro:
            accumulator.backward(micro_loss(part), count=count(part))
        accumulator.step()
        figures[f"{kind} loss: relative gradient error of loss / k"] = _relative_error(naive, reference)
        figures[f"{kind} loss: relative gradient error of trainwise"] = _relative_error(captured[0], reference)
    wrong = min(figures[k] for k in figures if "loss / k" in k)
    right = max(figures[k] for k in figures if "trainwise" in k)
    reading = (f"Dividing each micro-batch loss by the number of micro-batches gives gradients {wrong:.1%} or more "
               f"away from the full batch's when a window ends short or a loss averages over tokens; weighting each "
               f"micro-batch by its count, as GradientAccumulator does, leaves {right:.1e} (float rounding).")
    return LabResult(figures=figures, reading=reading, shown=wrong > 0.01 and right < 1e-5)


LAB = Lab(name="accumulation", fundamental=7, title="gradient accumulation: loss / k vs counted",
          codes=("TW106",), measure=measure)
