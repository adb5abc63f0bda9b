"""Fundamental 11: an exported model must match the eager model; one exported in train mode keeps dropout on and
BatchNorm on each batch's statistics, so it neither matches the model's evaluation outputs nor repeats itself.

Both artifacts are TorchScript (the cheapest format here: tracing or scripting takes a fraction of a second where
torch.export takes over one), written to a temporary folder, loaded back from disk and run on the same inputs.
"""

from __future__ import annotations

from trainwise.labs import Lab, LabResult


def measure() -> LabResult:
    import copy
    import tempfile
    import warnings
    from pathlib import Path

    import torch
    from torch.utils.data import DataLoader

    import trainwise
    from trainwise.demo import DigitsCNN, digits_datasets

    torch.manual_seed(0)
    train, val = digits_datasets(0)
    model = DigitsCNN(width=8)  # BatchNorm after each convolution, dropout before the head
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for inputs, targets in DataLoader(train, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0)):
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
    inputs = val.tensors[0][:64]
    example = inputs[:8]
    model.eval()
    with torch.inference_mode():
        expected = model(inputs)

    def compare(artifact) -> tuple[float, float, float]:
        with torch.no_grad():
            first, second = artifact(inputs), artifact(inputs)
        return (float((first - expected).abs().max()), float((first - second).abs().max()),
                float((first.argmax(1) == expected.argmax(1)).float().mean()))

    with tempfile.TemporaryDirectory(prefix="trainwise-lab-export-") as folder:
        # The wrong way: trace a copy in train mode (tracing runs forward, which would update the model's own
        # BatchNorm statistics), save it, load it back.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.jit's deprecation and tracer warnings
            traced = torch.jit.trace(copy.deepcopy(model).train(), example, check_trace=False)
            torch.jit.save(traced, str(Path(folder) / "train-mode.torchscript"))
        # Loaded back with the checked loader; trust_code=True: this TorchScript program is the one just written.
        wrong = compare(trainwise.load_exported(Path(folder) / "train-mode.torchscript", trust_code=True))
        # The right way: trainwise.export puts the model in eval mode and checks the artifact against eager.
        model.train()  # as it would be in the middle of training; export switches to eval mode and restores this
        report = trainwise.export(model, example, Path(folder) / "eval-mode.torchscript", format="torchscript")
        right = compare(trainwise.load_exported(report.path, trust_code=True))
        restored = model.training
    scale = float(expected.abs().max())
    figures = {
        "largest |eager eval output| (64 validation digits)": scale,
        "train-mode artifact (jit.trace of model.train()): max |output - eager eval output|": wrong[0],
        "train-mode artifact: max |call 1 - call 2| on the same inputs": wrong[1],
        "train-mode artifact: predictions equal to eager eval's": wrong[2],
        f"trainwise.export (TorchScript, {report.method}, eval mode): max |output - eager eval output|": right[0],
        "trainwise.export: max |call 1 - call 2| on the same inputs": right[1],
        "trainwise.export: predictions equal to eager eval's": right[2],
        "trainwise.export: its own parity check, max |difference|": report.max_abs_diff,
    }
    reading = (f"Exported in train mode, the artifact keeps dropout on and BatchNorm on batch statistics: its outputs "
               f"are up to {wrong[0]:.2f} away from the model's evaluation outputs (largest {scale:.2f}), two calls on "
               f"the same inputs differ by up to {wrong[1]:.2f}, and {wrong[2]:.0%} of its predictions agree; "
               f"trainwise.export (TorchScript here), always in eval mode and verified, is {right[0]:.2g} away, "
               f"repeats exactly and agrees on {right[2]:.0%}.")
    shown = (wrong[0] > 0.1 * scale and wrong[1] > 0.1 * scale and wrong[2] < 1
             and right[0] <= 1e-5 and right[1] == 0 and right[2] == 1 and restored)
    return LabResult(figures=figures, reading=reading, shown=shown)


LAB = Lab(name="export-mode", fundamental=11, title="export in train mode vs trainwise.export (eval, verified)",
          codes=("TW117",), measure=measure)
