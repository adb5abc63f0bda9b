"""Fundamental 9: ``total += loss`` keeps every step's autograd graph alive through ``total``; ``loss.item()`` or
:class:`trainwise.Mean` (which detaches) keep none.

Memory held is measured, not estimated: a ``saved_tensors_hooks`` pair records each tensor autograd saves for
backward (its storage's size and a weak reference), so the bytes still alive after each step are the saved
tensors some graph still holds. The graph's nodes are counted by walking ``total.grad_fn``.
"""

from __future__ import annotations

from pathlib import Path

from trainwise.labs import Lab, LabResult

STEPS = 40
BATCH, FEATURES, HIDDEN, CLASSES = 64, 128, 256, 10


class _SavedTensors:
    """Pack/unpack hooks that remember every saved tensor weakly; ``held()`` is the bytes still alive."""

    def __init__(self, exclude: set[int]) -> None:
        import weakref

        self._ref = weakref.ref
        self.exclude = exclude  # storages of the parameters: alive anyway
        self.records: list = []

    def pack(self, tensor):
        saved = tensor.detach()  # a tensor object of its own, held only by the graph that saved it
        storage = saved.untyped_storage()
        self.records.append((self._ref(saved), storage.data_ptr(), storage.nbytes()))
        return saved

    @staticmethod
    def unpack(saved):
        return saved

    def held(self) -> int:
        alive = {}
        for ref, pointer, nbytes in self.records:
            if pointer not in self.exclude and ref() is not None:
                alive[pointer] = nbytes
        self.records = [r for r in self.records if r[0]() is not None]
        return sum(alive.values())


def _graph_nodes(total) -> int:
    """Autograd nodes reachable from ``total`` (0 for a float or a detached tensor)."""
    seen: set[int] = set()
    stack = [getattr(total, "grad_fn", None)]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(child for child, _ in node.next_functions)
    return len(seen)


def measure() -> LabResult:
    import torch
    import torch.nn.functional as F
    from torch import nn

    from trainwise.metrics import Mean

    torch.manual_seed(0)
    g = torch.Generator()
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                          nn.Linear(HIDDEN, CLASSES))
    hooks = _SavedTensors({p.untyped_storage().data_ptr() for p in model.parameters()})

    def one_step(backward: bool):
        inputs = torch.randn(BATCH, FEATURES, generator=g)  # a new batch each step, as from a loader
        targets = torch.randint(0, CLASSES, (BATCH,), generator=g)
        loss = F.cross_entropy(model(inputs), targets)
        if backward:  # a training step (a plain SGD update by hand: a torch optimizer imports torch._dynamo)
            model.zero_grad(set_to_none=True)
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(p.grad, alpha=-0.01)
        return loss

    figures: dict = {}
    series: dict[str, list[float]] = {}
    nodes_per_step: list[int] = []
    step_bytes = 0
    for loop, backward in (("training", True), ("evaluation without no_grad", False)):
        for way in ("total += loss", "total += loss.item()", "Mean.update(loss)"):
            hooks.records.clear()
            g.manual_seed(0)  # the same batches for every way
            total = Mean() if way.startswith("Mean") else 0.0
            held, nodes = [], []
            with torch.autograd.graph.saved_tensors_hooks(hooks.pack, hooks.unpack):
                for step in range(STEPS):
                    loss = one_step(backward)
                    if way == "total += loss":
                        total += loss  # noqa: TW102 (the wrong way, on purpose)
                    elif way == "total += loss.item()":
                        total += loss.item()
                    else:
                        total.update(loss, BATCH)
                    if step == 0 and not backward:
                        step_bytes = hooks.held()  # one forward's saved tensors, while its loss is alive
                    del loss  # the next step drops it anyway: measure what is held beyond the step
                    held.append(hooks.held() / 2**20)
                    nodes.append(_graph_nodes(total.state if isinstance(total, Mean) else total))
            figures[f"{loop}, {way}: MB held after {STEPS} steps"] = held[-1]
            figures[f"{loop}, {way}: autograd nodes held"] = nodes[-1]
            series[f"MB held: {loop}, {way}"] = held
            series[f"nodes held: {loop}, {way}"] = [float(n) for n in nodes]
            if loop == "training" and way == "total += loss":
                nodes_per_step = nodes
            del total
    figures["one forward's saved tensors (MB)"] = step_bytes / 2**20
    wrong_eval = series["MB held: evaluation without no_grad, total += loss"]
    growth = (wrong_eval[-1] - wrong_eval[0]) / (STEPS - 1)
    figures["evaluation without no_grad, total += loss: MB more held per step"] = growth
    node_growth = (nodes_per_step[-1] - nodes_per_step[0]) / (STEPS - 1)
    figures["training, total += loss: autograd nodes more held per step"] = node_growth

    right_mb = max(figures[k] for k in figures if k.endswith(" steps") and ("item()" in k or "Mean" in k))
    right_nodes = max(figures[k] for k in figures if k.endswith("nodes held") and ("item()" in k or "Mean" in k))
    train_held = figures[f"training, total += loss: MB held after {STEPS} steps"]
    nodes = nodes_per_step[-1]
    reading = (f"With total += loss, an evaluation loop without no_grad kept every batch's saved activations: "
               f"{wrong_eval[-1]:.1f} MB after {STEPS} steps, {growth:.2f} MB more each step (one forward saves "
               f"{step_bytes / 2**20:.2f} MB); in a training loop backward frees them ({train_held:g} MB held) but "
               f"total still chains {node_growth:.0f} more autograd nodes each step ({nodes} after {STEPS}). "
               f"loss.item() and Mean held {right_mb:g} MB and {right_nodes} nodes.")
    shown = (growth > 0.9 * step_bytes / 2**20 > 0 and node_growth >= 1 and right_mb == 0.0 and right_nodes == 0)
    return LabResult(figures=figures, reading=reading, shown=shown, series=series)


def plot(result: LabResult, folder: Path) -> Path:
    """MB of saved tensors and autograd nodes held against the step, for each loop and way of keeping the total."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state

    fig = Figure(figsize=(11, 4.2))
    axes = fig.subplots(1, 2)
    for ax, what, label in ((axes[0], "MB held", "MB of saved tensors held by autograd"),
                            (axes[1], "nodes held", "autograd nodes held by the total")):
        for name, values in result.series.items():
            if not name.startswith(what + ": "):
                continue
            wrong = name.endswith("total += loss")
            ax.plot(range(1, len(values) + 1), values, label=name.removeprefix(what + ": "),
                    linestyle="-" if wrong else "--", linewidth=2 if wrong else 1.2)
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("total += loss keeps every step's graph (and, without backward, its activations); "
                 "loss.item() and Mean keep none", fontsize=10)
    fig.tight_layout()
    from trainwise.labs import save_figure

    return save_figure(fig, Path(folder) / "kept-graph.png")


LAB = Lab(name="kept-graph", fundamental=9, title="a running total of loss tensors vs loss.item()",
          codes=("TW102",), measure=measure, plot=plot)
