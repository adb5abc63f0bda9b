"""Fundamental 4: validation must run in eval mode (dropout off, BatchNorm on its running statistics) and
without autograd; in train mode it is random, scores lower and rewrites BatchNorm's running statistics."""

from __future__ import annotations

from trainwise.labs import Lab, LabResult

PASSES = 2
DROPOUT = 0.5


def measure() -> LabResult:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    from trainwise.demo import digits_datasets
    from trainwise.evaluation import evaluating
    from trainwise.guards.core import guard

    torch.manual_seed(0)
    train, val = digits_datasets(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(DROPOUT),
                          nn.Linear(64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loader = DataLoader(train, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0))
    for _ in range(3):
        for inputs, targets in loader:
            optimizer.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(inputs), targets).backward()
            optimizer.step()
    norm = model[2]
    val_loader = DataLoader(val, batch_size=32)
    trained = {name: value.clone() for name, value in model.state_dict().items()}  # each way starts from it

    def statistics() -> torch.Tensor:
        return torch.cat([norm.running_mean, norm.running_var]).clone()

    def passes(right: bool) -> tuple[list[torch.Tensor], list[float], float, int, list[str]]:
        """Evaluate the validation set PASSES times: outputs and accuracy of each pass, the relative change
        of BatchNorm's running statistics, its updates counted, and the codes the guard reported."""
        model.load_state_dict(trained)
        before, tracked = statistics(), int(norm.num_batches_tracked)
        outputs, accuracies = [], []
        with guard(model, action="record", checks=["TW103", "TW104"]) as watch:
            for _ in range(PASSES):
                if right:
                    with evaluating(model):
                        logits = [model(x) for x, _ in val_loader]
                else:  # what a loop does when it forgets model.eval(): train mode, autograd switched off
                    model.train()
                    with torch.no_grad():
                        logits = [model(x) for x, _ in val_loader]
                out = torch.cat(logits)
                outputs.append(out)
                accuracies.append(float((out.argmax(1) == val.tensors[1]).float().mean()))
        change = float((statistics() - before).norm() / before.norm())
        return outputs, accuracies, change, int(norm.num_batches_tracked) - tracked, sorted(
            {f.code for f in watch.findings})

    figures: dict[str, object] = {"validation samples": len(val), "dropout p": DROPOUT}
    results = {}
    for label, right in (("train mode + no_grad", False), ("trainwise.evaluating", True)):
        outputs, accuracies, change, updates, codes = passes(right)
        results[label] = (accuracies, change, updates)
        figures[f"{label}: largest output difference between two passes"] = float(
            (outputs[0] - outputs[1]).abs().max())
        for i, accuracy in enumerate(accuracies, 1):
            figures[f"{label}: accuracy, pass {i}"] = accuracy
        figures[f"{label}: relative change of BatchNorm running statistics"] = change
        figures[f"{label}: BatchNorm running-statistics updates"] = updates
        figures[f"{label}: guard findings"] = ", ".join(codes) or "none"

    # an evaluation in eval mode but with autograd on (TW104), collecting the outputs as a metric loop does:
    # every batch's graph stays alive with its output, holding activations for a backward that never runs
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}  # activations saved for backward, by storage (saved weights cost nothing)

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    model.load_state_dict(trained)
    model.eval()
    with guard(model, action="record", checks=["TW104"]) as watch:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            logits = [model(x) for x, _ in val_loader]
        held = sum(saved.values()) / 1024
    del logits
    figures["eval() with autograd on: KB of activations held by the collected outputs"] = held
    figures["eval() with autograd on: guard findings"] = ", ".join(sorted({f.code for f in watch.findings})) or "none"
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), evaluating(model):
        logits = [model(x) for x, _ in val_loader]
    figures["trainwise.evaluating: KB of activations held by the collected outputs"] = sum(saved.values()) / 1024
    del logits

    wrong_acc, wrong_change, wrong_updates = results["train mode + no_grad"]
    right_acc, right_change, right_updates = results["trainwise.evaluating"]
    wrong_diff = figures["train mode + no_grad: largest output difference between two passes"]
    right_diff = figures["trainwise.evaluating: largest output difference between two passes"]
    kept = figures["eval() with autograd on: KB of activations held by the collected outputs"]
    reading = (
        f"Evaluated in train mode, two passes over the same {len(val)} digits differed by up to {wrong_diff:.2f} "
        f"in a logit and scored {min(wrong_acc):.1%} and {max(wrong_acc):.1%}, and BatchNorm's running "
        f"statistics moved by {wrong_change:.1%} ({wrong_updates} updates); under trainwise.evaluating the passes "
        f"differ by {right_diff:.1e}, score {right_acc[0]:.1%} and the statistics move by {right_change:.1e}. "
        f"In eval mode with autograd on, the collected outputs held {kept:.0f} KB of activations for a backward "
        f"that never ran ({figures['trainwise.evaluating: KB of activations held by the collected outputs']:.0f} "
        f"under evaluating)."
    )
    shown = (wrong_diff > 0.1 and max(wrong_acc) < right_acc[0] and wrong_change > 1e-3 and wrong_updates > 0
             and right_diff == 0.0 and right_change == 0.0 and right_updates == 0
             and right_acc[0] == right_acc[-1] and kept > 0
             and figures["trainwise.evaluating: KB of activations held by the collected outputs"] == 0)
    return LabResult(figures=figures, reading=reading, shown=shown)


LAB = Lab(name="eval-mode", fundamental=4, title="evaluation in train mode vs trainwise.evaluating",
          codes=("TW103", "TW104"), measure=measure)
