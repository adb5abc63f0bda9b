"""Fundamental 3: ``nn.Module`` registers the submodules it is given as attributes, so ``parameters()``,
``.to()`` and ``state_dict()`` see them; layers kept in a plain Python list are invisible to all three, and so
to the optimizer and to checkpoints, while the forward still uses them."""

from __future__ import annotations

from trainwise.labs import Lab, LabResult

STEPS = 30


def measure() -> LabResult:
    import torch
    from torch import nn

    from trainwise.guards.core import guard

    class Net(nn.Module):
        def __init__(self, registered: bool) -> None:
            super().__init__()
            self.stem = nn.Linear(8, 16)
            blocks = [nn.Linear(16, 16) for _ in range(3)]
            self.blocks = nn.ModuleList(blocks) if registered else blocks  # the only difference
            self.head = nn.Linear(16, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = torch.relu(self.stem(x))
            for block in self.blocks:
                x = torch.relu(block(x))
            return self.head(x)

    g = torch.Generator().manual_seed(0)
    inputs = torch.randn(128, 8, generator=g)
    targets = torch.sin(inputs.sum(1, keepdim=True))

    def build(registered: bool) -> nn.Module:
        torch.manual_seed(0)  # the same initial weights for both
        return Net(registered)

    reference = build(True)
    used = sum(p.numel() for p in reference.parameters())  # registered, the blocks hold the same layers
    figures: dict[str, object] = {"parameters the forward uses": used}
    with torch.no_grad():
        figures["loss before training"] = float(nn.functional.mse_loss(reference(inputs), targets))
    changes = {}
    unregistered: dict[str, list[str]] = {}  # the places the TW114 guard named
    for label, registered in (("Python list", False), ("nn.ModuleList", True)):
        model = build(registered)
        figures[f"{label}: parameters in model.parameters() and the optimizer"] = sum(
            p.numel() for p in model.parameters())
        figures[f"{label}: state_dict keys"] = len(model.state_dict())
        start = [b.weight.detach().clone() for b in model.blocks]
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        with guard(model, optimizer, action="record", checks=["TW107", "TW114"]) as watch:
            for _ in range(STEPS):
                optimizer.zero_grad(set_to_none=True)
                nn.functional.mse_loss(model(inputs), targets).backward()
                optimizer.step()
        changes[label] = max(float((b.weight.detach() - s).abs().max()) for b, s in zip(model.blocks, start))
        figures[f"{label}: largest change of the blocks' weights in {STEPS} steps"] = changes[label]
        with torch.no_grad():
            figures[f"{label}: loss after {STEPS} steps"] = float(
                nn.functional.mse_loss(model(inputs), targets))
        figures[f"{label}: TW107 guard findings"] = sum(f.code == "TW107" for f in watch.findings)
        unregistered[label] = [f.where for f in watch.findings if f.code == "TW114"]
        figures[f"{label}: TW114 guard findings"] = len(unregistered[label])
        # a checkpoint round trip: a fresh model of the same class, loaded from this one's state_dict
        torch.manual_seed(1)
        restored = Net(registered)
        restored.load_state_dict(model.state_dict())
        with torch.no_grad():
            figures[f"{label}: largest output difference after a state_dict round trip"] = float(
                (restored(inputs) - model(inputs)).abs().max())
        model.to(torch.float64)
        figures[f"{label}: blocks converted by model.to(float64)"] = sum(
            b.weight.dtype == torch.float64 for b in model.blocks)

    seen_list = figures["Python list: parameters in model.parameters() and the optimizer"]
    seen_module_list = figures["nn.ModuleList: parameters in model.parameters() and the optimizer"]
    round_list = figures["Python list: largest output difference after a state_dict round trip"]
    round_module_list = figures["nn.ModuleList: largest output difference after a state_dict round trip"]
    findings = figures["Python list: TW107 guard findings"]
    why = (": it compares the optimizer with the parameters the model registers, and these never were"
           if findings == 0 else "")
    named = unregistered["Python list"]
    reading = (
        f"With its blocks in a Python list the model shows the optimizer {seen_list} of the {used} parameters its "
        f"forward uses ({seen_module_list} with nn.ModuleList), so {STEPS} Adam steps changed the blocks' weights "
        f"by at most {changes['Python list']:.1e} (vs {changes['nn.ModuleList']:.3f}); its state_dict omits them "
        f"too, and a reloaded copy's outputs differ by {round_list:.3f} (vs {round_module_list:.1e}). The TW107 "
        f"guard found {findings} problem(s){why}; the TW114 guard, which walks the modules' attributes when it "
        f"starts, found {len(named)} ({', '.join(f'model.{w}' for w in named) or 'none'})."
    )
    shown = (seen_list < seen_module_list == used and changes["Python list"] == 0.0
             and changes["nn.ModuleList"] > 1e-3 and round_list > 1e-3 and round_module_list == 0.0
             and unregistered == {"Python list": ["blocks"], "nn.ModuleList": []})
    return LabResult(figures=figures, reading=reading, shown=shown)


LAB = Lab(name="unregistered", fundamental=3, title="layers in a Python list vs nn.ModuleList",
          codes=("TW114",), measure=measure)  # TW107 compares the optimizer with the registered parameters only
