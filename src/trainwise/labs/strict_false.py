"""Fundamental 8: a checkpoint saved from ``nn.DataParallel`` (keys ``module.*``) or ``torch.compile`` (keys
``_orig_mod.*``) loaded with ``load_state_dict(strict=False)`` loads nothing, silently; ``load_weights`` matches
the prefixes and loads every tensor."""

from __future__ import annotations

from trainwise.labs import Lab, LabResult


def _model():
    from torch import nn

    return nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))


def _max_difference(model, reference: dict) -> float:
    state = model.state_dict()
    return max(float((state[k].double() - v.double()).abs().max()) for k, v in reference.items())


def measure() -> LabResult:
    import tempfile
    import warnings
    from pathlib import Path

    import torch

    from trainwise.checkpoint.weights import load_weights

    torch.manual_seed(0)
    trained = _model()
    with torch.no_grad():  # "trained": weights and running statistics away from a fresh model's
        for tensor in trained.state_dict().values():
            if tensor.is_floating_point():
                tensor.add_(torch.randn(tensor.shape))
    reference = {k: v.clone() for k, v in trained.state_dict().items()}
    total = len(reference)
    # nn.DataParallel wraps without a GPU (it keeps the module and no device); torch.compile's OptimizedModule
    # keeps the model as ``_orig_mod``, whose state_dict is the same keys prefixed (built here by hand: creating
    # one imports torch._dynamo, seconds of import for a dictionary of renamed keys).
    layouts = {
        "DataParallel (module.)": torch.nn.DataParallel(trained).state_dict(),
        "torch.compile (_orig_mod.)": {f"_orig_mod.{k}": v for k, v in trained.state_dict().items()},
    }
    figures: dict = {"tensors in the saved model's state_dict": total}
    with tempfile.TemporaryDirectory() as folder:
        for layout, state in layouts.items():
            path = Path(folder) / "checkpoint.pt"
            torch.save(state, path)

            torch.manual_seed(1)
            fresh = _model()
            checkpoint = torch.load(path, weights_only=True)
            result = fresh.load_state_dict(checkpoint, strict=False)
            # every checkpoint key not reported unexpected was copied into the model (missing_keys would not
            # do: BatchNorm does not report a missing num_batches_tracked)
            figures[f"{layout}, strict=False: tensors loaded"] = len(checkpoint) - len(result.unexpected_keys)
            figures[f"{layout}, strict=False: max weight difference from the saved model"] = _max_difference(
                fresh, reference)

            torch.manual_seed(1)
            fresh = _model()
            with warnings.catch_warnings(record=True) as caught:  # a partial load would warn
                warnings.simplefilter("always")
                report = load_weights(fresh, path)
            figures[f"{layout}, load_weights: tensors loaded"] = len(report.loaded)
            figures[f"{layout}, load_weights: max weight difference from the saved model"] = _max_difference(
                fresh, reference)
            figures[f"{layout}, load_weights: prefix change"] = "; ".join(report.prefix_changes) or "none"
            figures[f"{layout}, load_weights: warnings"] = len(caught)

    def worst(way: str, figure: str, pick) -> float:
        return pick(figures[f"{layout}, {way}: {figure}"] for layout in layouts)

    wrong_loaded = worst("strict=False", "tensors loaded", max)
    wrong_diff = worst("strict=False", "max weight difference from the saved model", min)
    right_loaded = worst("load_weights", "tensors loaded", min)
    right_diff = worst("load_weights", "max weight difference from the saved model", max)
    reading = (f"load_state_dict(strict=False) raised nothing and loaded {wrong_loaded} of {total} tensors from "
               f"either wrapped checkpoint, leaving the fresh model's random weights (up to {wrong_diff:.2f} away "
               f"from the saved ones); load_weights matched the prefixes and loaded {right_loaded} of {total}, "
               f"{right_diff:g} away.")
    shown = (wrong_loaded == 0 and wrong_diff > 0.1 and right_loaded == total and right_diff == 0.0
             and worst("load_weights", "warnings", max) == 0)
    return LabResult(figures=figures, reading=reading, shown=shown)


LAB = Lab(name="strict-false", fundamental=8, title="wrapped checkpoints: strict=False vs load_weights",
          codes=("TW302", "TW301"), measure=measure)
