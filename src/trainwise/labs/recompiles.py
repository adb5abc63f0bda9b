"""Fundamental 2: ``torch.compile`` traces a graph just in time and specialises it to the input shapes it saw, so
static shapes recompile for every new batch size; a dynamic batch dimension compiles one graph for all of them
(torch still specialises size 1). Counted with a backend that counts its calls (eager: no C++ compiler)."""

from __future__ import annotations

from pathlib import Path

from trainwise.labs import Lab, LabResult

BATCH_SIZES = tuple(range(1, 9))


def measure() -> LabResult:
    import logging
    import time

    import torch
    import torch._dynamo

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    # the batch sizes, then one more after them: dynamo's recompile limit (8 by default) may refuse that one
    inputs = [torch.randn(b, 16) for b in (*BATCH_SIZES, BATCH_SIZES[-1] + 1)]
    with torch.no_grad():
        eager = [model(x) for x in inputs]

    def run(dynamic: bool | None, mark: bool) -> tuple[list[str], float, int, float, list[float]]:
        """Call the compiled model on every batch size: the batch size each graph was compiled for ("any" for
        a symbolic one), the seconds those calls took, the graphs compiled for one more size afterwards, the
        largest difference from eager outputs and the graphs compiled so far after each call."""
        graphs: list[str] = []

        def counting_backend(gm, example_inputs):  # runs once per compiled graph; eager backend: no C++ needed
            symbolic = any(isinstance(x, torch.SymInt) for x in example_inputs)  # a dynamic size is an input
            batch = [x.shape[0] for x in example_inputs
                     if isinstance(x, torch.Tensor) and not isinstance(x, torch.nn.Parameter)]
            graphs.append("any" if symbolic else str(batch[0]) if batch else "?")
            return gm.forward

        torch._dynamo.reset()
        compiled = torch.compile(model, backend=counting_backend, dynamic=dynamic)
        error = 0.0
        seconds = 0.0
        so_far: list[float] = []
        started = time.perf_counter()
        quiet = logging.getLogger("torch._dynamo")  # hitting the recompile limit logs a warning: measured here
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            with torch.no_grad():
                for i, (x, expected) in enumerate(zip(inputs, eager)):
                    if i == len(BATCH_SIZES):
                        seconds, compiled_before = time.perf_counter() - started, len(graphs)
                    if mark:
                        x = x.clone()
                        torch._dynamo.mark_dynamic(x, 0)
                    error = max(error, float((compiled(x) - expected).abs().max()))
                    so_far.append(float(len(graphs)))
        finally:
            quiet.setLevel(level)
            torch._dynamo.reset()
        return graphs[:compiled_before], seconds, len(graphs) - compiled_before, error, so_far

    torch._dynamo.reset()  # warm-up: dynamo's one-time start-up cost is charged to no variant
    torch.compile(lambda x: x + 1, backend=lambda gm, example_inputs: gm.forward)(torch.ones(2))
    variants = (
        ("dynamic=False", False, False),
        ("default (automatic dynamic)", None, False),
        ("batch dimension marked dynamic", None, True),
    )
    calls = f"{len(BATCH_SIZES)} calls"
    figures: dict[str, object] = {"batch sizes called": f"{BATCH_SIZES[0]}..{BATCH_SIZES[-1]}"}
    errors = []
    counts = {}
    series = {"batch size": [float(len(x)) for x in inputs]}
    for label, dynamic, mark in variants:
        graphs, seconds, more, error, so_far = run(dynamic, mark)
        series[label] = so_far
        counts[label] = len(graphs)
        errors.append(error)
        figures[f"{label}: graphs compiled"] = len(graphs)
        figures[f"{label}: compiled for batch sizes"] = ", ".join(graphs)
        figures[f"{label}: seconds for the {calls}"] = seconds
        if label == "dynamic=False":
            figures[f"dynamic=False: graphs compiled for batch size {len(inputs[-1])} afterwards"] = more
    limit = getattr(torch._dynamo.config, "recompile_limit", None) or getattr(torch._dynamo.config,
                                                                               "cache_size_limit", None)
    figures["recompile limit (torch._dynamo.config)"] = limit
    figures["largest difference from eager outputs"] = max(errors)

    static = counts["dynamic=False"]
    marked = counts["batch dimension marked dynamic"]
    after = figures[f"dynamic=False: graphs compiled for batch size {len(inputs[-1])} afterwards"]
    refused = ": that call ran uncompiled" if after == 0 else ""
    reading = (
        f"With dynamic=False torch.compile compiled {static} graphs for the batch sizes "
        f"{figures['batch sizes called']} ({figures[f'dynamic=False: seconds for the {calls}']:.2f} s) and "
        f"{after} for batch size {len(inputs[-1])} afterwards (recompile limit {limit}{refused}); with the batch "
        f"dimension marked dynamic it compiled {marked} (for batch sizes "
        f"{figures['batch dimension marked dynamic: compiled for batch sizes']}, "
        f"{figures[f'batch dimension marked dynamic: seconds for the {calls}']:.2f} s) and the default "
        f"{counts['default (automatic dynamic)']}. Every compiled output matched eager within {max(errors):.1e}."
    )
    shown = static == len(BATCH_SIZES) and marked <= 2 and max(errors) < 1e-5
    series["recompile limit"] = [float(limit)] if limit else []
    return LabResult(figures=figures, reading=reading, shown=shown, series=series)


def plot(result: LabResult, folder: Path) -> Path:
    """Graphs compiled so far after each call, by the call's batch size, for each way of compiling."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state

    fig = Figure(figsize=(7.5, 4.2))
    ax = fig.add_subplot()
    sizes = result.series["batch size"]
    styles = {"dynamic=False": ("tab:red", "o", "-", 2.0), "default (automatic dynamic)": ("tab:orange", "s", "-", 4.0),
              "batch dimension marked dynamic": ("tab:blue", "^", "--", 1.5)}  # the last two overlap: wide vs dashed
    for label, (color, marker, line, width) in styles.items():
        ax.step(sizes, result.series[label], where="post", color=color, marker=marker, linestyle=line,
                linewidth=width, label=label)
    if result.series.get("recompile limit"):
        limit = result.series["recompile limit"][0]
        ax.axhline(limit, color="gray", linestyle=":", label=f"recompile limit ({limit:g}): later sizes run eager")
    ax.set_xlabel("batch size of the call (called in this order)")
    ax.set_ylabel("graphs compiled so far")
    ax.set_title("torch.compile: static shapes compile a graph per new batch size, a dynamic batch dimension "
                 "does not", fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    from trainwise.labs import save_figure

    return save_figure(fig, Path(folder) / "recompiles.png")


LAB = Lab(name="recompiles", fundamental=2, title="torch.compile: recompiles per batch size vs a dynamic dimension",
          codes=("TW115",), measure=measure, plot=plot)
