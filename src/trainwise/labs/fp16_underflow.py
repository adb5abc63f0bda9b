"""Fundamental 12: float16 has a narrow range, so small gradients flush to zero without a gradient scaler;
bfloat16 has float32's range and needs none.

CPU autocast cannot run float16 the way CUDA does, so the float16 (and bfloat16) arithmetic is emulated by casts:
the real float32 gradients of a small model are rounded to float16 (``.half()``) and compared with the float32
ones; values below half of float16's smallest subnormal (2**-25) round to zero. Only the parameter gradients are
cast, not the gradients flowing between layers inside the backward pass, so real float16 training loses more.
Late in training the loss and its gradients are far smaller than in this short run, so the loss is multiplied by
:data:`LATE` before the backward pass to stand for that.
"""

from __future__ import annotations

from pathlib import Path

from trainwise.labs import Lab, LabResult

LATE = 2.0**-12  # the loss late in training, relative to this lab's after a few steps
SMALLEST_SUBNORMAL = -24  # log2 of float16's smallest subnormal; below half of it a value rounds to zero
SMALLEST_NORMAL = -14  # log2 of float16's smallest normal; below it precision is lost bit by bit


def measure() -> LabResult:
    import math

    import torch
    import torch.nn.functional as F

    from trainwise import resolve_precision
    from trainwise.demo import digits_datasets

    torch.manual_seed(0)
    train, _ = digits_datasets(0)
    inputs, targets = train.tensors[0].flatten(1), train.tensors[1]
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10))
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    for _ in range(30):  # full-batch steps: the model fits most training digits
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(inputs), targets).backward()
        optimizer.step()

    def gradient(factor: float) -> tuple[float, torch.Tensor]:
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(inputs), targets)
        (loss * factor).backward()
        return loss.item(), torch.cat([p.grad.flatten() for p in params])

    def lost_and_error(rounded: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
        nonzero = exact != 0
        flushed = float(((rounded == 0) & nonzero).sum() / nonzero.sum())
        return flushed, float((rounded - exact).norm() / exact.norm())

    trained_loss, as_trained = gradient(1.0)
    at_trained = lost_and_error(as_trained.half().float(), as_trained)[0]
    exact = gradient(LATE)[1]  # float32, the reference
    fp16 = lost_and_error(exact.half().float(), exact)

    # The right way: trainwise's fp16 policy comes with a GradScaler; scale the loss, let the gradients be float16
    # (emulated: cast in place), then unscale in float32 and check for inf/NaN as GradScaler.unscale_ does.
    scaler = resolve_precision("fp16", "cpu").make_scaler()
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(F.cross_entropy(model(inputs), targets) * LATE).backward()
    with torch.no_grad():
        for p in params:
            p.grad.copy_(p.grad.half().float())
    scaler.unscale_(optimizer)
    found_inf = not all(bool(torch.isfinite(p.grad).all()) for p in params)
    scaled = lost_and_error(torch.cat([p.grad.flatten() for p in params]), exact)
    bf16_scaler = resolve_precision("bf16", "cpu").make_scaler()
    bf16 = lost_and_error(exact.bfloat16().float(), exact)

    magnitudes = exact[exact != 0].abs()
    late = round(math.log2(LATE))
    figures = {
        "loss after 30 full-batch steps": trained_loss,
        "float16 (emulated by a cast), loss as trained: nonzero gradient elements flushed to zero": at_trained,
        f"late training (the loss x 2**{late}): nonzero gradient elements below float16's smallest subnormal "
        f"2**{SMALLEST_SUBNORMAL}":
            float((magnitudes < 2.0**SMALLEST_SUBNORMAL).float().mean()),
        f"late training: nonzero gradient elements below float16's smallest normal 2**{SMALLEST_NORMAL}":
            float((magnitudes < 2.0**SMALLEST_NORMAL).float().mean()),
        "late, float16 without a scaler (emulated by a cast): flushed to zero": fp16[0],
        "late, float16 without a scaler (emulated by a cast): relative gradient error": fp16[1],
        f"late, float16 with GradScaler (x {scaler.get_scale():g}, cast, unscaled in float32): flushed to zero":
            scaled[0],
        "late, float16 with GradScaler: relative gradient error": scaled[1],
        "late, float16 with GradScaler: inf or NaN found (it would skip the step)": found_inf,
        "late, bfloat16 (emulated by a cast, trainwise gives it no scaler): flushed to zero": bf16[0],
        "late, bfloat16: relative gradient error": bf16[1],
    }
    reading = (f"Emulating float16 by a cast, {fp16[0]:.1%} of the nonzero gradient elements flush to zero once the "
               f"loss is 2**{late} of this run's ({at_trained:.1%} already at the loss as trained) and the gradient "
               f"is {fp16[1]:.1%} off; scaled by {scaler.get_scale():g} before the cast and unscaled in float32, as "
               f"GradScaler does, {scaled[0]:.1%} flush and it is {scaled[1]:.1e} off; bfloat16 flushes "
               f"{bf16[0]:.0%} (float32's range) and is {bf16[1]:.2%} off from its shorter mantissa.")
    shown = (fp16[0] > 0.1 and fp16[1] > 0.02 and scaled[0] < fp16[0] / 10 and scaled[1] < 1e-3 and not found_inf
             and bf16[0] == 0 and bf16[1] < 1e-2 and bf16_scaler is None)
    series = {
        "log2 |gradient|, late training": magnitudes.log2().tolist(),
        f"log2 |gradient x {scaler.get_scale():g}| (GradScaler)": (magnitudes * scaler.get_scale()).log2().tolist(),
    }
    return LabResult(figures=figures, reading=reading, shown=shown, series=series)


def plot(result: LabResult, folder: Path) -> Path:
    """Histogram of the gradients' magnitudes (log2), with and without the scaler, against float16's range."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state

    fig = Figure(figsize=(7.5, 4.2))
    ax = fig.add_subplot()
    values = list(result.series.values())
    low, high = min(min(v) for v in values), max(max(v) for v in values)
    bins = [low + (high - low) * i / 80 for i in range(81)]
    for (name, logs), color in zip(result.series.items(), ("tab:red", "tab:blue")):
        ax.hist(logs, bins=bins, alpha=0.55, color=color, label=name)
    ax.axvspan(min(low, SMALLEST_SUBNORMAL - 1) - 1, SMALLEST_SUBNORMAL - 1, color="gray", alpha=0.15,
               label=f"rounds to zero in float16 (below 2**{SMALLEST_SUBNORMAL - 1})")
    ax.axvline(SMALLEST_SUBNORMAL, color="black", linewidth=1.5,
               label=f"float16 smallest subnormal 2**{SMALLEST_SUBNORMAL}")
    ax.axvline(SMALLEST_NORMAL, color="black", linestyle="--", linewidth=1,
               label=f"float16 smallest normal 2**{SMALLEST_NORMAL}")
    ax.axvline(16, color="gray", linestyle=":", linewidth=1, label="float16 largest (65504, about 2**16)")
    ax.set_xlabel("log2 |gradient element|  (float16 emulated by casts)")
    ax.set_ylabel("gradient elements")
    ax.set_title(f"float16 flushes gradients below 2**{SMALLEST_SUBNORMAL - 1}; the scaler moves them into range",
                 fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    from trainwise.labs import save_figure

    return save_figure(fig, Path(folder) / "fp16-underflow.png")


LAB = Lab(name="fp16-underflow", fundamental=12, title="float16 gradients without a scaler vs with one vs bfloat16",
          codes=("TW109", "TW401"), measure=measure, plot=plot)
