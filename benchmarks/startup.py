"""Whole-process start-up costs of trainwise against ``python -c "import torch"``, in fresh processes.

Every measurement is a fresh ``sys.executable`` process timed from outside by the parent (``time.perf_counter``
around ``subprocess.run``), so interpreter start-up and every import count, as they do for a user:

``import torch`` (the baseline), ``python -c "import torch"``. Every ratio below divides by it.
``import trainwise``, ``python -c "import trainwise"``. Target: ratio <= 1.05.
``first step``, ``trainwise demo`` (``trainwise.cli.main(["demo", "--epochs", "1", "--json", ...])`` in a child
    that first installs ``torch.optim.optimizer.register_optimizer_step_post_hook``): the child reports the
    wall-clock moment (``time.time()``) of the end of the first optimizer step and exits there; the parent
    subtracts its own ``time.time()`` at launch. Reported as the time to the first step minus the same
    round's ``import torch`` process. Target: <= 0.5 s. A reference child does the same with a hand-written
    loop (the demo's CNN, AdamW, one batch, plain torch): what torch itself costs before a first step.
``ckpt inspect``, ``trainwise ckpt inspect CKPT`` on a training checkpoint of the demo's CNN. Target: ratio
    <= 1.5.
``predict``, ``trainwise predict ART.pt2 BATCH.npy`` on a ``trainwise export --demo`` artifact of that
    checkpoint. No target: the ratio is reported.

The checkpoint and the artifact are made once, before the timed rounds, in one untimed child (a one-epoch
Trainer fit of the demo's CNN on 128 digits, then ``trainwise export CKPT --demo``). The CLI children run
``trainwise.cli.main`` as the ``trainwise`` console script does. Each round runs every process once, in a
random order; the report gives per process the median and the spread (min-max) of the wall time, the ratio of
the medians to ``import torch`` and the median and range of the per-round paired ratios (each process against
the ``import torch`` of its own round). The instrumented children also report how many modules were loaded
(at the first step, or at exit) and which heavy ones (``torch._dynamo``, ``sympy``, ``matplotlib``, ``onnx``...)
among them, with the import chain that first loaded each: a ``sys.meta_path`` finder records the stack of the
first real import of each (a few microseconds per import; nothing is timed from inside it).

    python benchmarks/startup.py                 # 7 rounds (about 3 minutes on 2 cores)
    python benchmarks/startup.py --repeats 11 --json

Nothing here asserts a time: the numbers mean something only as ratios within one run, on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

HEAVY = (
    "torch._dynamo",
    "sympy",
    "torch.distributed.fsdp",
    "matplotlib",
    "onnx",
    "onnxscript",
    "onnxruntime",
    "libcst",
    "tensorboard",
)
TARGETS = {"import_trainwise": 1.05, "ckpt_inspect": 1.5}  # ratio of medians to import torch
FIRST_STEP_TARGET = 0.5  # seconds after what import torch costs

# -- children: python -c programs, arguments in sys.argv[1:] (report file, heavy module names, ...) -----------

# Records, for each heavy module, the stack of its first real import (not an importlib.util.find_spec probe),
# and writes the report (loaded heavy modules, module count, wall-clock time) as JSON to sys.argv[1].
PROBE = r"""
import sys, time, json
_HEAVY = sys.argv[2].split(",")
_report = {"chains": {}}
class _Watch:
    def find_spec(self, name, path=None, target=None):
        if (name in _HEAVY and name not in _report["chains"]
                and sys._getframe(2).f_code.co_name == "_find_and_load_unlocked"):
            import traceback
            _report["chains"][name] = [f"{f.filename}:{f.lineno} {f.name}"
                                       for f in traceback.extract_stack(sys._getframe(1))
                                       if not f.filename.startswith("<")]
        return None
sys.meta_path.insert(0, _Watch())
def _emit(**extra):
    _report.update(extra, heavy=[m for m in _HEAVY if m in sys.modules], modules=len(sys.modules), time=time.time())
    with open(sys.argv[1], "w") as f:
        json.dump(_report, f)
"""

FIRST_STEP_HOOK = r"""
import os
import torch
_report["torch_imported"] = time.time()
from torch.optim.optimizer import register_optimizer_step_post_hook
def _first_step(optimizer, args, kwargs):
    _emit(first_step=time.time())
    sys.stdout.flush()
    os._exit(0)
register_optimizer_step_post_hook(_first_step)
"""

DEMO = (
    PROBE
    + FIRST_STEP_HOOK
    + r"""
from trainwise.cli import main
main(["demo", "--epochs", "1", "--json", "--device", sys.argv[3], "--run-dir", sys.argv[4]])
raise SystemExit("trainwise demo ended without an optimizer step")
"""
)

# The demo's CNN (trainwise.demo.DigitsCNN) and one batch of its size, in plain torch.
HAND = (
    PROBE
    + FIRST_STEP_HOOK
    + r"""
from torch import nn
torch.manual_seed(0)
w = 32
model = nn.Sequential(
    nn.Conv2d(1, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU(),
    nn.Conv2d(w, 2 * w, 3, padding=1), nn.BatchNorm2d(2 * w), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(2 * w, 2 * w, 3, padding=1), nn.BatchNorm2d(2 * w), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
    nn.Flatten(), nn.Dropout(0.2), nn.Linear(2 * w, 10),
).to(sys.argv[3])
inputs = torch.rand(64, 1, 8, 8, device=sys.argv[3])
targets = torch.randint(0, 10, (64,), device=sys.argv[3])
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
model.train()
optimizer.zero_grad(set_to_none=True)
loss = nn.functional.cross_entropy(model(inputs), targets)
loss.backward()
optimizer.step()
raise SystemExit("the hand-written step did not reach the hook")
"""
)

CLI = (
    PROBE
    + r"""
from trainwise.cli import main
_code = main(sys.argv[3:])
_emit()
sys.exit(_code)
"""
)

# Untimed, once: a training checkpoint of the demo's CNN, its torch.export artifact, and an input batch.
SETUP = r"""
import sys
from pathlib import Path
import numpy as np
from torch.utils.data import Subset
from trainwise import Trainer
from trainwise.cli import main
from trainwise.demo import digits_datasets, make_model
root = Path(sys.argv[1])
train, _ = digits_datasets(0)
trainer = Trainer(epochs=1, batch_size=64, device="cpu", progress="off", plot=False, seed=0,
                  run_dir=str(root / "run"))
trainer.fit(make_model, Subset(train, range(128)), None)
checkpoint = sorted((root / "run" / "checkpoints").glob("ckpt-*.pt"))[-1]
if main(["export", str(checkpoint), "--demo", "--output", str(root / "digits-cnn.pt2"), "--json"]) != 0:
    raise SystemExit("trainwise export failed")
np.save(root / "batch.npy", train.tensors[0][:8].numpy())
print(checkpoint)
"""

# name: (label, kind, target text)
MEASUREMENTS = {
    "import_torch": ('python -c "import torch"', "baseline", "the baseline"),
    "import_trainwise": ('python -c "import trainwise"', "plain", f"ratio <= {TARGETS['import_trainwise']}"),
    "first_step": ("trainwise demo, start to first step", "step", f"<= {FIRST_STEP_TARGET} s over import torch"),
    "first_step_hand": ("hand-written loop, start to first step", "step", "reference: plain torch"),
    "ckpt_inspect": ("trainwise ckpt inspect CKPT", "cli", f"ratio <= {TARGETS['ckpt_inspect']}"),
    "predict": ("trainwise predict ART.pt2 BATCH.npy", "cli", "none (reported)"),
}
REPORTED = ("import_trainwise", "first_step", "ckpt_inspect", "predict")  # the four measurements of the issue
# Appended to the plain python -c programs (both sides alike): what was loaded, at a negligible cost.
PLAIN_TAIL = '; import sys; print(len(sys.modules), "torch" in sys.modules)'


def _setup(folder: Path) -> dict[str, str]:
    done = subprocess.run([sys.executable, "-c", SETUP, str(folder)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"making the checkpoint and the artifact failed (exit {done.returncode}):\n{done.stderr}")
    return {
        "checkpoint": done.stdout.strip().splitlines()[-1],
        "artifact": str(folder / "digits-cnn.pt2"),
        "batch": str(folder / "batch.npy"),
    }


def _command(name: str, files: dict[str, str], report: Path, run_dir: Path, device: str) -> list[str]:
    heavy = ",".join(HEAVY)
    if name == "import_torch":
        return [sys.executable, "-c", "import torch" + PLAIN_TAIL]
    if name == "import_trainwise":
        return [sys.executable, "-c", "import trainwise" + PLAIN_TAIL]
    if name == "first_step":
        return [sys.executable, "-c", DEMO, str(report), heavy, device, str(run_dir)]
    if name == "first_step_hand":
        return [sys.executable, "-c", HAND, str(report), heavy, device]
    if name == "ckpt_inspect":
        return [sys.executable, "-c", CLI, str(report), heavy, "ckpt", "inspect", files["checkpoint"]]
    return [sys.executable, "-c", CLI, str(report), heavy, "predict", files["artifact"], files["batch"]]


def _spawn(name: str, files: dict[str, str], folder: Path, device: str) -> dict[str, Any]:
    report = folder / f"{name}.json"
    run_dir = Path(tempfile.mkdtemp(dir=folder)) / "run"
    report.unlink(missing_ok=True)
    command = _command(name, files, report, run_dir, device)
    launched = time.time()
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{name} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    result: dict[str, Any] = {"seconds": seconds}
    if MEASUREMENTS[name][1] in ("baseline", "plain"):
        count, torch_loaded = done.stdout.split()[-2:]
        result.update(modules=int(count), torch_loaded=torch_loaded == "True")
        return result
    child = json.loads(report.read_text())
    result.update(modules=child["modules"], heavy=child["heavy"], chains=child["chains"])
    if "first_step" in child:
        result.update(first_step=child["first_step"] - launched, torch_imported=child["torch_imported"] - launched)
    return result


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _short(frame: str) -> str:
    """A stack frame with the site-packages or the repository prefix cut off."""
    for prefix in (sysconfig.get_paths()["purelib"], str(Path(__file__).resolve().parents[1] / "src")):
        if frame.startswith(prefix):
            return frame[len(prefix) :].lstrip(os.sep)
    return frame


def _chain(frames: list[str]) -> list[str]:
    """The import chain from the outermost trainwise (or child program) frame to the import itself."""
    short = [_short(f) for f in frames]
    start = next((i for i, f in enumerate(short) if f.startswith("trainwise")), 0)
    return [f for f in short[start:] if not f.startswith("<")]


def parent(args: argparse.Namespace) -> int:
    names = list(MEASUREMENTS)
    order = random.Random(args.seed)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    started = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="trainwise-startup-") as tmp:
        folder = Path(tmp)
        files = _setup(folder)
        setup_seconds = time.perf_counter() - started
        if not args.json:
            print(f"  checkpoint and artifact made ({setup_seconds:.0f} s)", file=sys.stderr, flush=True)
        for repeat in range(args.repeats):
            group = list(names)
            order.shuffle(group)
            for name in group:
                runs[name].append(_spawn(name, files, folder, args.device))
            if not args.json:
                print(f"  round {repeat + 1}/{args.repeats} done ({time.perf_counter() - started:.0f} s)",
                      file=sys.stderr, flush=True)

    import torch  # only for the version in the report, after every child has run

    base = [r["seconds"] for r in runs["import_torch"]]
    report: dict[str, Any] = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "repeats": args.repeats,
        "device": args.device,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "load_average_1min": [load_before, os.getloadavg()[0] if load_before is not None else None],
        "seconds": time.perf_counter() - started,
        "setup_seconds": setup_seconds,
        "heavy_watched": list(HEAVY),
        "measurements": {},
    }
    for name in names:
        label, kind, target = MEASUREMENTS[name]
        rows = runs[name]
        seconds = [r["seconds"] for r in rows]
        entry: dict[str, Any] = {
            "label": label,
            "target": target,
            "seconds": _summary(seconds),
            "ratio": statistics.median(seconds) / statistics.median(base),
            "pair_ratio": _summary([s / b for s, b in zip(seconds, base)]),
            "modules": rows[0]["modules"],
        }
        if kind in ("baseline", "plain"):
            entry["torch_loaded"] = rows[0]["torch_loaded"]
        else:
            entry["heavy_modules"] = rows[0]["heavy"]
            entry["import_chains"] = {m: _chain(frames) for m, frames in rows[0]["chains"].items()}
        if kind == "step":
            first = [r["first_step"] for r in rows]
            entry["first_step"] = _summary(first)
            entry["torch_imported"] = _summary([r["torch_imported"] for r in rows])
            entry["over_import_torch"] = _summary([f - b for f, b in zip(first, base)])
            if name == "first_step":
                hand = [r["first_step"] for r in runs["first_step_hand"]]
                entry["over_hand_loop"] = _summary([f - h for f, h in zip(first, hand)])
        if name in TARGETS:
            entry["target_met"] = entry["ratio"] <= TARGETS[name]
        elif name == "first_step":
            entry["target_met"] = entry["over_import_torch"]["median"] <= FIRST_STEP_TARGET
        report["measurements"][name] = entry

    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    _print_table(report)
    return 0


def _print_table(report: dict[str, Any]) -> None:
    def cell(s: dict[str, float]) -> str:
        return f"{s['median']:.3f} [{s['min']:.3f}-{s['max']:.3f}]"

    load = report["load_average_1min"]
    print(
        f"\nStart-up against python -c \"import torch\": {report['repeats']} interleaved rounds of fresh processes, "
        f"device {report['device']}, Python {report['python']}, torch {report['torch']}"
    )
    if load[0] is not None:
        print(f"load average (1 min) before/after: {load[0]:.2f}/{load[1]:.2f}; took {report['seconds']:.0f} s "
              f"(setup {report['setup_seconds']:.0f} s)")
    print("seconds per process, median [min-max]; ratio = median(process) / median(import torch)\n")
    print(f"{'process':<40} {'seconds':<22} {'ratio':>6}  {'per-round ratio [min-max]':<26} {'modules':>7}")
    m = report["measurements"]
    for entry in m.values():
        p = entry["pair_ratio"]
        print(f"{entry['label']:<40} {cell(entry['seconds']):<22} {entry['ratio']:>6.3f}  "
              f"{p['median']:.3f} [{p['min']:.3f}-{p['max']:.3f}]{'':<5} {entry['modules']:>7}")

    print("\nfirst optimizer step, seconds after launch, median [min-max]:")
    for name in ("first_step", "first_step_hand"):
        e = m[name]
        print(f"  {e['label']:<40} {cell(e['first_step'])}  (torch imported at {e['torch_imported']['median']:.3f}); "
              f"minus import torch {cell(e['over_import_torch'])}")
    print(f"  trainwise demo minus the hand-written loop, per round: {cell(m['first_step']['over_hand_loop'])}")

    print("\ntargets:")
    print(f"  import trainwise / import torch <= {TARGETS['import_trainwise']}: "
          f"{m['import_trainwise']['ratio']:.3f} ({'met' if m['import_trainwise']['target_met'] else 'NOT met'}; "
          f"torch loaded by import trainwise: {m['import_trainwise']['torch_loaded']})")
    over = m["first_step"]["over_import_torch"]["median"]
    print(f"  first step - import torch <= {FIRST_STEP_TARGET} s: {over:.3f} s "
          f"({'met' if m['first_step']['target_met'] else 'NOT met'})")
    print(f"  ckpt inspect / import torch <= {TARGETS['ckpt_inspect']}: {m['ckpt_inspect']['ratio']:.3f} "
          f"({'met' if m['ckpt_inspect']['target_met'] else 'NOT met'})")
    print(f"  predict / import torch: {m['predict']['ratio']:.3f} (no target)")

    print(f"\nheavy modules loaded ({', '.join(report['heavy_watched'])}), and where each was first imported from:")
    for entry in m.values():
        if "heavy_modules" not in entry:
            continue
        print(f"  {entry['label']}: {', '.join(entry['heavy_modules']) or 'none'} ({entry['modules']} modules)")
        chains = entry["import_chains"]
        for module, chain in chains.items():
            via = next((other for other in chains if other != module and _inside(chain, other)), None)
            if via:  # loaded by another heavy module's own imports: its import site only
                print(f"    {module}: by {via}, at {chain[-1]}")
                continue
            print(f"    {module}:")
            for frame in chain:
                print(f"      {frame}")


def _inside(chain: list[str], module: str) -> bool:
    """Whether a frame of ``chain`` runs inside ``module``'s own files."""
    folder = module.replace(".", "/")
    return any(frame.startswith((folder + "/", folder + ".py")) for frame in chain)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="interleaved rounds (one run of each process) (7)")
    parser.add_argument("--device", default="cpu", help="device of the demo and the hand-written loop (cpu)")
    parser.add_argument("--seed", type=int, default=0, help="run-order seed (0)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
