"""How ``trainwise doctor``'s time grows with the size of what it checks: N copies of a small training loop
against 4N, per shape of code; a linear analysis gives a ratio near 4.

    .venv/bin/python benchmarks/doctor_scaling.py                 # N = 250 (and 1000), 3 repeats
    .venv/bin/python benchmarks/doctor_scaling.py --n 1000 --repeats 5 --shapes functions,module
    .venv/bin/python benchmarks/doctor_scaling.py --json          # one JSON summary as the last line

Shapes (each generated in a temporary folder):

``functions``  one file, N functions, each building a model and an optimizer and running a training loop
               (zero_grad, forward, loss, backward, step) and an evaluation loop under ``no_grad`` that prints
               an accuracy;
``module``     the same N loops at module level, one after the other (the same names bound N times);
``notebook``   a notebook of N code cells (model, training loop and evaluation cells in turn);
``project``    N files that import one another (each a helper of the previous one and a training loop).

Each measurement is a fresh process that imports the doctor first and then times ``check_paths`` on the
generated path with every rule selected, as process CPU time (``time.process_time``: the machine may be
shared); the report gives the median of the repeats for N and 4N and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HEADER = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 2))

    def forward(self, x):
        return self.body(x)


train_loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))), batch_size=8)
test_loader = DataLoader(TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,))), batch_size=8)
criterion = nn.CrossEntropyLoss()
"""

# One training run: model, optimizer, training loop, evaluation loop, the accuracy printed.
LOOP = """\
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model.train()
for inputs, labels in train_loader:
    optimizer.zero_grad()
    outputs = model(inputs)
    loss = criterion(outputs, labels)
    loss.backward()
    optimizer.step()
model.eval()
correct = 0
with torch.no_grad():
    for inputs, labels in test_loader:
        correct += (model(inputs).argmax(1) == labels).sum().item()
print("accuracy", correct / len(test_loader.dataset))
"""

CELLS = (
    "model = Net()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n",
    "model.train()\nfor inputs, labels in train_loader:\n    optimizer.zero_grad()\n    outputs = model(inputs)\n"
    "    loss = criterion(outputs, labels)\n    loss.backward()\n    optimizer.step()\n",
    "model.eval()\ncorrect = 0\nwith torch.no_grad():\n    for inputs, labels in test_loader:\n"
    "        correct += (model(inputs).argmax(1) == labels).sum().item()\n"
    "print('accuracy', correct / len(test_loader))\n",
)


def _indent(text: str) -> str:
    return "".join(f"    {line}" if line.strip() else line for line in text.splitlines(keepends=True))


def functions_file(n: int) -> str:
    """N training runs, each in its own function."""
    return HEADER + "".join(f"\n\ndef run_{i}():\n{_indent(LOOP)}" for i in range(n))


def module_file(n: int) -> str:
    """N training runs at module level, the same names bound again by each."""
    return HEADER + "".join(f"\n{LOOP}" for _ in range(n))


def notebook(n: int) -> str:
    """A notebook of N code cells after a header cell: model, training and evaluation cells in turn."""
    sources = [HEADER] + [CELLS[i % len(CELLS)] for i in range(n)]
    cells = [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
              "source": source.splitlines(keepends=True)} for source in sources]
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def project(folder: Path, n: int) -> None:
    """N modules of a package, each importing the previous one's helper and training with it."""
    package = folder / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "m0.py").write_text(HEADER + "\n\ndef fit_0(model, optimizer, loader):\n" + _indent(
        LOOP.split("model.eval()")[0].split("model.train()\n")[1]) + "    return model\n")
    for i in range(1, n):
        text = (f"import torch\nfrom pkg.m{i - 1} import fit_{i - 1}\nfrom pkg.m0 import Net, train_loader, "
                f"criterion\n\n\ndef fit_{i}(model, optimizer, loader):\n    model.train()\n"
                f"    return fit_{i - 1}(model, optimizer, loader)\n\n\ndef main_{i}():\n{_indent(LOOP)}"
                f"    fit_{i}(model, optimizer, train_loader)\n")
        (package / f"m{i}.py").write_text(text)


def build(shape: str, n: int, folder: Path) -> Path:
    """Write the code of one shape and size under ``folder``; the path to check."""
    if shape == "functions":
        (folder / "train.py").write_text(functions_file(n))
        return folder / "train.py"
    if shape == "module":
        (folder / "train.py").write_text(module_file(n))
        return folder / "train.py"
    if shape == "notebook":
        (folder / "train.ipynb").write_text(notebook(n))
        return folder / "train.ipynb"
    project(folder, n)
    return folder / "pkg"


CHILD = """\
import sys, time
from trainwise.doctor.engine import Config, check_paths
config = Config(select=("ALL",))
start = time.process_time()
results = check_paths([sys.argv[1]], config)
elapsed = time.process_time() - start
print(elapsed, sum(len(r.findings) for r in results))
"""


def measure(path: Path, timeout: float) -> tuple[float, int] | None:
    """CPU seconds of one ``check_paths`` in a fresh process and its number of findings; None past ``timeout``."""
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    if proc.returncode != 0:
        raise SystemExit(f"the doctor failed on {path}:\n{proc.stderr[-2000:]}")
    seconds, findings = proc.stdout.split()
    return float(seconds), int(findings)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=250, help="the small size N; 4N is the large one (default 250)")
    parser.add_argument("--repeats", type=int, default=3, help="fresh-process runs per size (default 3)")
    parser.add_argument("--shapes", default="functions,module,notebook,project",
                        help="comma-separated: functions, module, notebook, project (default all)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds before one run is given up")
    parser.add_argument("--json", action="store_true", help="print one JSON summary as the last line")
    args = parser.parse_args(argv)
    summary: dict[str, dict[str, object]] = {}
    print(f"{'shape':10} {'N':>6} {'CPU s':>8} {'4N':>6} {'CPU s':>8} {'ratio':>6}  findings")
    for shape in args.shapes.split(","):
        medians: list[float | None] = []
        counts: list[int] = []
        for size in (args.n, 4 * args.n):
            with tempfile.TemporaryDirectory() as tmp:
                path = build(shape, size, Path(tmp))
                runs = [measure(path, args.timeout) for _ in range(args.repeats)]
            done = [r for r in runs if r is not None]
            medians.append(statistics.median(r[0] for r in done) if len(done) == len(runs) else None)
            counts.append(done[0][1] if done else -1)
        small, large = medians
        ratio = large / small if small and large is not None else None
        shown = [f"{m:8.3f}" if m is not None else "  > " + f"{args.timeout:.0f}".ljust(4) for m in medians]
        print(f"{shape:10} {args.n:6} {shown[0]} {4 * args.n:6} {shown[1]} "
              f"{ratio if ratio is None else format(ratio, '6.2f')}  {counts[0]}/{counts[1]}")
        summary[shape] = {"n": args.n, "cpu_s": medians, "ratio": ratio, "findings": counts}
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
