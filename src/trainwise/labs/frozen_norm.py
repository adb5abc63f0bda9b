"""Fundamental 6: a frozen backbone's BatchNorm keeps updating its running statistics under ``model.train()``
when it is frozen with ``requires_grad_(False)``; :func:`trainwise.freeze` keeps it in eval mode."""

from __future__ import annotations

from trainwise.labs import Lab, LabResult

STEPS = 30


def _backbone_and_head():
    from torch import nn

    backbone = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
    )
    return nn.ModuleDict({"backbone": backbone, "head": nn.Linear(8, 4)})


def _forward(model, inputs):
    return model["head"](model["backbone"](inputs))


def _running_stats(model) -> dict:
    return {name: tensor.detach().clone() for name, tensor in model["backbone"].state_dict().items()
            if "running_" in name or "num_batches_tracked" in name}


def measure() -> LabResult:
    import copy

    import torch

    from trainwise.freezing import freeze, param_groups

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    pretrained = _backbone_and_head()
    pretrained.train()
    with torch.no_grad():  # "pretraining": running statistics settle on the pretraining data, N(0, 1) images
        for _ in range(50):
            _forward(pretrained, torch.randn(32, 3, 8, 8, generator=g))
    # the fine-tuning data look different (brighter, more contrast), as they usually do
    batches = [(torch.randn(16, 3, 8, 8, generator=g) * 2.0 + 0.5, torch.randint(0, 4, (16,), generator=g))
               for _ in range(STEPS)]
    probe = torch.randn(64, 3, 8, 8, generator=g) * 2.0 + 0.5
    pretrained.eval()
    with torch.no_grad():
        features_before = pretrained["backbone"](probe)
    stats_before = _running_stats(pretrained)

    figures: dict = {"largest eval output of the backbone before fine-tuning (for scale)": float(
        features_before.abs().max())}
    for way in ("requires_grad_(False)", "freeze()"):
        model = copy.deepcopy(pretrained)
        if way == "freeze()":
            freeze(model, "backbone")
            handed = [p for group in param_groups(model) for p in group["params"]]  # trainable parameters only
        else:
            model["backbone"].requires_grad_(False)
            handed = list(model.parameters())  # the tutorial's optimizer(model.parameters())
        frozen = {id(p) for p in model["backbone"].parameters()}
        in_optimizer = sum(id(p) in frozen for p in handed)
        model.train()  # as every training loop does, each epoch
        for inputs, targets in batches:
            for p in handed:
                p.grad = None
            torch.nn.functional.cross_entropy(_forward(model, inputs), targets).backward()
            with torch.no_grad():  # plain SGD by hand: a torch optimizer would import torch._dynamo (seconds)
                for p in handed:
                    if p.grad is not None:
                        p.add_(p.grad, alpha=-0.05)
        model.eval()
        with torch.no_grad():
            features_after = model["backbone"](probe)
        stats_after = _running_stats(model)
        mean_change = max(float((stats_after[k] - stats_before[k]).abs().max())
                          for k in stats_before if k.endswith("running_mean"))
        var_change = max(float((stats_after[k] - stats_before[k]).abs().max())
                         for k in stats_before if k.endswith("running_var"))
        figures[f"{way}: frozen tensors handed to the optimizer"] = in_optimizer
        figures[f"{way}: max change of running_mean"] = mean_change
        figures[f"{way}: max change of running_var"] = var_change
        figures[f"{way}: max change of the frozen backbone's eval outputs"] = float(
            (features_after - features_before).abs().max())
        figures[f"{way}: running statistics bitwise unchanged"] = all(
            torch.equal(stats_after[k], stats_before[k]) for k in stats_before)

    wrong, right = "requires_grad_(False)", "freeze()"
    drift = max(figures[f"{wrong}: max change of running_mean"], figures[f"{wrong}: max change of running_var"])
    moved = figures[f"{wrong}: max change of the frozen backbone's eval outputs"]
    scale = figures["largest eval output of the backbone before fine-tuning (for scale)"]
    handed = figures[f"{wrong}: frozen tensors handed to the optimizer"]
    kept = max(figures[f"{right}: max change of running_mean"], figures[f"{right}: max change of running_var"])
    kept_out = figures[f"{right}: max change of the frozen backbone's eval outputs"]
    verdict = "bit for bit unchanged" if figures[f"{right}: running statistics bitwise unchanged"] else "changed"
    reading = (f"After {STEPS} train-mode steps, the backbone frozen with requires_grad_(False) moved its BatchNorm "
               f"running statistics by up to {drift:.3f} and its eval outputs by up to {moved:.3f} (which reach "
               f"{scale:.2f}), although none of its weights trained (and its {handed} frozen tensors sat in the "
               f"optimizer); with freeze() the statistics moved {kept:g} and the outputs {kept_out:g}: {verdict}.")
    shown = (drift > 0.1 and moved > 0.01 and not figures[f"{wrong}: running statistics bitwise unchanged"]
             and figures[f"{right}: running statistics bitwise unchanged"] and kept == 0.0 and kept_out == 0.0
             and figures[f"{right}: frozen tensors handed to the optimizer"] == 0)
    return LabResult(figures=figures, reading=reading, shown=shown)


LAB = Lab(name="frozen-norm", fundamental=6, title="frozen BatchNorm: requires_grad_(False) vs freeze()",
          codes=("TW107", "TW108"), measure=measure)
