"""Every subcommand driven as a user drives it, in a subprocess, with the inputs users get wrong.

A user's mistake (a missing file, the wrong kind of file, an array of the wrong shape, a bad flag) exits 2 with
one line on stderr that names the fix, in the command line's own spelling (``--device auto``, not
``device='auto'``), and never a traceback. Output into a pipe whose reader has gone (``| head``) ends quietly
with exit code 0. Cases that start torch in the child run concurrently (two at a time per core) and are marked
slow; the others take a tenth of a second each.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import random
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "trainwise.cli"]
TIMEOUT = 180
# A Python keyword argument in a message: device='auto', overwrite=True, format=None
PYTHON_SPELLING = re.compile(r"(?<![\w.\-])[a-z_]+=(?:'|\"|True\b|False\b|None\b)")

FACTORIES = """
import torch
from torch.utils.data import TensorDataset


def model(width=4):
    return torch.nn.Sequential(torch.nn.Linear(3, width), torch.nn.ReLU(), torch.nn.Linear(width, 2))


def data(features=3, n=32):
    x = torch.randn(n, features, generator=torch.Generator().manual_seed(0))
    dataset = TensorDataset(x, (x[:, 0] > 0).long())
    return dataset, dataset


def data_list():
    return list(data())
"""

CONFIG = """
[model]
factory = "cli_factories:model"
[data]
factory = "cli_factories:data"
[trainer]
epochs = 1
batch_size = 8
progress = "off"
plot = false
"""


@dataclasses.dataclass(frozen=True)
class Case:
    """``trainwise ARGV`` (``{name}`` replaced by the files below) and what must come of it."""

    id: str
    argv: tuple[str, ...]
    code: int = 2
    contains: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    closed_stdout: bool = False  # the reader of stdout is gone before the command writes


@dataclasses.dataclass
class Outcome:
    code: int
    out: str
    err: str

    def __str__(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.out[-3000:]}\n--- stderr\n{self.err[-3000:]}"


def run(argv: list[str], cwd: Path, *, closed_stdout: bool = False) -> Outcome:
    if not closed_stdout:
        proc = subprocess.run([*CLI, *argv], capture_output=True, text=True, cwd=cwd, timeout=TIMEOUT)
        return Outcome(proc.returncode, proc.stdout, proc.stderr)
    with tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen([*CLI, *argv], stdout=subprocess.PIPE, stderr=err, cwd=cwd, text=True)
        child.stdout.close()  # the reader goes away at once: every write of the command meets a closed pipe
        code = child.wait(timeout=TIMEOUT)
        err.seek(0)
        return Outcome(code, "", err.read())


def check(case: Case, outcome: Outcome) -> None:
    assert "Traceback" not in outcome.out + outcome.err, outcome
    assert outcome.code == case.code, outcome
    if case.code == 0:  # a closed pipe: nothing on stderr at all ("Exception ignored ... BrokenPipeError")
        assert outcome.err == "", outcome
        return
    lines = [line for line in outcome.err.splitlines() if line.strip()]
    assert len(lines) == 1, outcome
    line = lines[0]
    assert line.startswith("trainwise") and ": error: " in line and line.endswith((".", "?")), line
    assert not PYTHON_SPELLING.search(line), f"Python spelling in a CLI message: {line}"
    for text in case.contains:
        assert text in line, (text, line)
    for text in case.absent:
        assert text not in line, (text, line)


def materialise(case: Case, files: dict[str, str]) -> list[str]:
    return [part.format(**files) for part in case.argv]


# -- cases whose child never imports torch ------------------------------------------------------------------

FAST = [
    Case("no-command-bad-flag", ("--bogus",), contains=("unrecognized arguments: --bogus", "trainwise --help")),
    Case("demo-unknown-flag", ("demo", "--bogus"), contains=("trainwise demo: error:", "--bogus", "demo --help")),
    Case("demo-not-a-number", ("demo", "--epochs", "x"), contains=("--epochs", "'x'")),
    Case("demo-no-epochs", ("demo", "--epochs", "0"), contains=("--epochs must be at least 1",)),
    Case("demo-negative-workers", ("demo", "--workers", "-1"), contains=("--workers must be 0 or more",)),
    Case("fit-missing-config", ("fit", "missing.toml"), contains=("'missing.toml' not found",)),
    Case("fit-text-file", ("fit", "{text}"), contains=("is not valid TOML",)),
    Case("fit-random-bytes", ("fit", "{random}"), contains=("is not UTF-8 text",)),
    Case("fit-empty-file", ("fit", "{empty_toml}"), contains=("has no [model] table",)),
    Case("fit-directory", ("fit", "{folder}"), contains=("cannot read config file",)),
    Case("fit-unknown-flag", ("fit", "{config}", "--bogus"), contains=("unrecognized arguments: --bogus",)),
    Case("fit-unknown-option", ("fit", "{config}", "epochz=3"), contains=("epochz", "epochs")),
    Case("fit-unknown-table", ("fit", "{config}", "modle.factory=x:y"), contains=("unknown table 'modle'",)),
    Case("fit-deeply-nested-config", ("fit", "{deep_toml}"), contains=("nests arrays or tables too deeply",)),
    Case("fit-deeply-nested-override", ("fit", "{config}", "model.kwargs.width={deep_value}"),
         contains=("nests too deeply to read",)),
    Case("fit-factory-module-raises", ("fit", "{config}", "model.factory=cli_bad_raises:model"),
         contains=("importing module 'cli_bad_raises' raised ValueError ('no settings file')",
                   "at cli_bad_raises.py:3")),
    Case("fit-factory-module-syntax-error", ("fit", "{config}", "model.factory=cli_bad_syntax:model"),
         contains=("module 'cli_bad_syntax' has a syntax error at cli_bad_syntax.py:2",)),
    Case("fit-factory-module-exits-0", ("fit", "{config}", "model.factory=cli_bad_exits:model"),
         contains=("raised SystemExit (sys.exit(0)) at cli_bad_exits.py:2",)),
    Case("fit-factory-module-import-error", ("fit", "{config}", "data.factory=cli_bad_imports:data"),
         contains=("importing module 'cli_bad_imports' raised ImportError", "at cli_bad_imports.py:1")),
    Case("ckpt-no-action", ("ckpt",), contains=("trainwise ckpt inspect FILE",)),
    Case("ckpt-unknown-action", ("ckpt", "bogus"), contains=("invalid choice: 'bogus'",)),
    Case("ckpt-unknown-format", ("ckpt", "inspect", "x.pt", "--format", "xml"), contains=("invalid choice",)),
    Case("ckpt-convert-no-output", ("ckpt", "convert", "x.pt"), contains=("required: OUT",)),
    Case("export-unknown-flag", ("export", "--bogus"), contains=("unrecognized arguments: --bogus",)),
    Case("export-unknown-format", ("export", "--demo", "--format", "xml"), contains=("invalid choice: 'xml'",)),
    Case("export-not-a-number", ("export", "--demo", "--atol", "tiny"), contains=("--atol",)),
    Case("predict-no-input", ("predict", "model.pt2"), contains=("required: INPUT.npy",)),
    Case("predict-unknown-flag", ("predict", "m.pt2", "x.npy", "--bogus"), contains=("unrecognized arguments",)),
    Case("doctor-missing-file", ("doctor", "missing.py"), contains=("missing.py does not exist",)),
    Case("doctor-unknown-code", ("doctor", "--select", "ZZZ", "{folder}"), contains=("--select", "'ZZZ'")),
    Case("doctor-unknown-rule", ("doctor", "--explain", "TW999"), contains=("no rule 'TW999'",)),
    Case("doctor-unknown-format", ("doctor", "--format", "xml"), contains=("invalid choice: 'xml'",)),
    Case("doctor-unknown-flag", ("doctor", "--bogus"), contains=("unrecognized arguments: --bogus",)),
    Case("pipe-doctor-explain", ("doctor", "--explain", "TW102"), code=0, closed_stdout=True),
    Case("pipe-doctor-json", ("doctor", "--format", "json", "{doctor_project}"), code=0, closed_stdout=True),
    Case("pipe-doctor-text", ("doctor", "{doctor_project}"), code=0, closed_stdout=True),
    Case("pipe-doctor-list-rules", ("doctor", "--list-rules"), code=0, closed_stdout=True),
    Case("pipe-help", ("--help",), code=0, closed_stdout=True),
    Case("pipe-ckpt-help", ("ckpt", "inspect", "--help"), code=0, closed_stdout=True),
]


@pytest.fixture(scope="module")
def plain_files(tmp_path_factory) -> dict[str, str]:
    """Files that need no torch: text, random bytes, empty, a config and its factories, a doctor project."""
    folder = tmp_path_factory.mktemp("cli-errors")
    (folder / "notes.txt").write_text("these are notes, not a checkpoint\n")
    # seeded: os.urandom began with 0x80 (a pickle's first byte) one run in 256, and the export case then failed
    (folder / "random.bin").write_bytes(random.Random(0).randbytes(4096))
    (folder / "empty.toml").write_bytes(b"")
    (folder / "cli_factories.py").write_text(FACTORIES)
    (folder / "config.toml").write_text(CONFIG)
    (folder / "a-folder").mkdir()
    (folder / "deep.toml").write_text("x = " + "[" * 3000 + "]" * 3000 + "\n")  # RecursionError in tomllib
    (folder / "cli_bad_raises.py").write_text("import os\n\nraise ValueError('no settings file')\n")
    (folder / "cli_bad_syntax.py").write_text("def model():\n    return (\n")
    (folder / "cli_bad_exits.py").write_text("import sys\nsys.exit(0)\n")  # fit must not exit 0 untrained
    (folder / "cli_bad_imports.py").write_text("from os import no_such_name\n")  # ImportError, not "not installed"
    (folder / "cli_exits_in_call.py").write_text("import sys\n\n\ndef data():\n    sys.exit(0)\n")
    project = folder / "project"
    project.mkdir()
    for i in range(400):  # enough findings that the output outgrows any pipe buffer
        (project / f"train_{i}.py").write_text("import torch\nstate = torch.load('model.pt')\n")
    return {
        "root": str(folder),
        "text": str(folder / "notes.txt"),
        "random": str(folder / "random.bin"),
        "empty_toml": str(folder / "empty.toml"),
        "config": str(folder / "config.toml"),
        "folder": str(folder / "a-folder"),
        "deep_toml": str(folder / "deep.toml"),
        "deep_value": "[" * 3000 + "]" * 3000,
        "doctor_project": str(project),
    }


@pytest.mark.parametrize("case", FAST, ids=[case.id for case in FAST])
def test_fast_user_errors(case, plain_files):
    check(case, run(materialise(case, plain_files), Path(plain_files["root"]), closed_stdout=case.closed_stdout))


def test_output_into_head_ends_quietly(plain_files):
    """As a shell runs it: ``trainwise doctor --format json PROJECT | head -n 1`` (with pipefail: our status)."""
    command = f"set -o pipefail; {shlex.join(CLI)} doctor --format json {shlex.quote(plain_files['doctor_project'])}"
    for reader in ("head -n 1", "head -n 0", "head -c 10"):
        proc = subprocess.run(["bash", "-c", f"{command} | {reader}"], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and proc.stderr == "", (reader, proc.stderr)


# -- cases whose child imports torch: run concurrently ---------------------------------------------------------


def _unavailable_device() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return "cuda"
    if not torch.backends.mps.is_available():
        return "mps"
    return None


UNAVAILABLE = _unavailable_device()
# A folder no user can create files in, root included (sysfs refuses new files); None off Linux.
UNWRITABLE_FOLDER = "/sys/kernel" if os.path.isdir("/sys/kernel") else None
# What a case needs that this machine may lack: the case is skipped with the reason.
NEEDS = {
    "fit-tensorboard-folder-unwritable": ("tensorboard", UNWRITABLE_FOLDER is not None),
    "lab-plot-under-a-file": ("matplotlib", True),
    "lab-plot-under-proc": ("matplotlib", os.path.isdir("/proc")),
}


def _missing(case_id: str) -> str | None:
    """Why a case cannot run here, or None."""
    import importlib.util

    if case_id not in NEEDS:
        return None
    package, possible = NEEDS[case_id]
    if importlib.util.find_spec(package) is None:
        return f"needs {package}"
    return None if possible else "needs Linux's /sys and /proc"

SLOW = [  # what the in-process tests of each command cannot show: the process as a user runs it
    # demo
    Case("demo-device-not-here", ("demo", "--device", f"{UNAVAILABLE}", "--json", "--run-dir", "{root}/demo-b"),
         contains=("--device auto",), absent=("device=",)),
    Case("demo-run-folder-taken", ("demo", "--run-dir", "{taken}", "--json"),
         contains=("already holds a run", "--run-dir", "--overwrite"), absent=("resume", "run_dir", "overwrite=")),
    # fit
    Case("fit-data-factory-returns-a-list", ("fit", "{config}", "data.factory=cli_factories:data_list",
                                             "run_dir={root}/fit-a"),
         contains=("cli_factories:data_list returned a list", "tuple (train, val)")),
    Case("fit-data-of-the-wrong-shape", ("fit", "{config}", "data.kwargs.features=5", "run_dir={root}/fit-b"),
         contains=("does not fit the model", "shapes cannot be multiplied")),
    Case("fit-device-not-here", ("fit", "{config}", f"device={UNAVAILABLE}", "run_dir={root}/fit-c"),
         contains=("use device=auto",)),
    Case("fit-run-folder-taken", ("fit", "{config}", "run_dir={run}"),
         contains=("resume=auto", "overwrite=true")),
    Case("fit-data-factory-exits-0", ("fit", "{config}", "data.factory=cli_exits_in_call:data",
                                      "run_dir={root}/fit-d"),
         contains=("[data] factory cli_exits_in_call:data raised SystemExit (sys.exit(0)) at cli_exits_in_call.py:5",)),
    # TensorBoard's writer thread printed its own traceback after our sentence; /sys denies root too
    Case("fit-tensorboard-folder-unwritable", ("fit", "{config}", "loggers=tensorboard", "run_dir={tb_run}"),
         contains=("the tensorboard folder", "is not writable", "leave 'tensorboard' out of loggers")),
    # lab: a --plot folder that cannot be made (as root too: under a file, under /proc)
    Case("lab-plot-under-a-file", ("lab", "accuracy", "--plot", "{text}/plots"),
         contains=("--plot", "a part of its path is a file")),
    Case("lab-plot-under-proc", ("lab", "accuracy", "--plot", "/proc/trainwise-plots/x"),
         contains=("--plot /proc/trainwise-plots/x cannot be created",)),
    # ckpt
    Case("ckpt-inspect-missing", ("ckpt", "inspect", "{root}/missing.pt"), contains=("does not exist",)),
    Case("ckpt-inspect-text", ("ckpt", "inspect", "{text}"), contains=("not a checkpoint",)),
    Case("ckpt-inspect-empty", ("ckpt", "inspect", "{empty_pt}"), contains=("is empty",)),
    Case("ckpt-convert-over-a-file", ("ckpt", "convert", "{checkpoint}", "{keep}"),
         contains=("already exists", "--force")),
    # export
    Case("export-missing-checkpoint", ("export", "{root}/missing.pt", "--demo"), contains=("does not exist",)),
    Case("export-random-checkpoint", ("export", "{random}", "--demo", "-o", "{root}/e1.pt2"),
         contains=("not a checkpoint",)),
    Case("export-weights-of-another-model", ("export", "{checkpoint}", "--demo", "-o", "{root}/e2.pt2"),
         contains=("do not fit the model", "--model and --model-kwargs"), absent=("strict",)),
    Case("export-shape-the-model-cannot-take", ("export", "--demo", "--example-shape", "1,3,8,8", "-o",
                                                "{root}/e3.pt2"), contains=("fails on the example inputs",)),
    Case("export-over-its-checkpoint", ("export", "{renamed}", "--model", "cli_factories:model", "--example-shape",
                                        "1,3", "-o", "{renamed}"), contains=("is the checkpoint being exported",)),
    # predict
    Case("predict-text-artifact", ("predict", "{text}", "{x}"), contains=("--format",)),
    Case("predict-empty-artifact", ("predict", "{empty_pt2}", "{x}"), contains=("not a readable .pt2",)),
    Case("predict-training-checkpoint-named-pt2", ("predict", "{renamed}", "{x}"),
         contains=("is a trainwise training checkpoint, not an exported model", "`trainwise export {renamed} ",
                   "--example-shape 1,3")),
    Case("predict-training-checkpoint-format", ("predict", "{checkpoint}", "{x}", "--format", "torch.export"),
         contains=("is a trainwise training checkpoint, not an exported model",
                   "`trainwise export {checkpoint} --model cli_factories:model --example-shape 1,3`",
                   "`trainwise predict {run}/model.pt2 {x}`")),
    Case("predict-training-checkpoint-onnx", ("predict", "{checkpoint}", "{x}", "--format", "onnx"),
         contains=("training checkpoint", "--format onnx`", "{run}/model.onnx")),
    Case("predict-missing-input", ("predict", "{artifact}", "{root}/none.npy"), contains=("does not exist",)),
    Case("predict-torchscript-untrusted", ("predict", "{torchscript}", "{x}"),
         contains=("refusing to load {torchscript}", "is a program", "pass --trust-code", ".pt2"),
         absent=("trust_code",)),
    Case("predict-torchscript-trusted", ("predict", "{torchscript}", "{x}", "--trust-code", "--json"), code=0),
    Case("predict-damaged-torchscript-trusted", ("predict", "{empty_torchscript}", "{x}", "--trust-code"),
         contains=("not a readable TorchScript file",)),
    Case("predict-input-of-the-wrong-shape", ("predict", "{artifact}", "{x_wrong}"),
         contains=("must have shape (batch, 3), got (2, 5)",)),
    # a reader that goes away
    Case("pipe-predict-json", ("predict", "{artifact}", "{x_big}", "--json"), code=0, closed_stdout=True),
    Case("pipe-ckpt-inspect", ("ckpt", "inspect", "{checkpoint}"), code=0, closed_stdout=True),
    Case("pipe-fit-print-config", ("fit", "{config}", "--print-config"), code=0, closed_stdout=True),
]


@pytest.fixture(scope="module")
def torch_files(plain_files) -> dict[str, str]:
    """A real run of ``trainwise fit`` (its checkpoint and fit.json), that checkpoint renamed .pt2, an exported
    artifact of the same model, input arrays, and damaged stand-ins."""
    import numpy as np
    import torch

    import trainwise
    from trainwise.cli.fit import load_config, search_path, train

    root = Path(plain_files["root"])
    run_dir = root / "run"
    config = root / "config.toml"
    try:
        with search_path(config):  # as trainwise fit runs it: fit.json and a checkpoint in run_dir
            summary = train(load_config(config, [f"run_dir={run_dir}"]))
            assert summary["stopped"] == "completed"
            model = sys.modules["cli_factories"].model()
    finally:
        sys.modules.pop("cli_factories", None)
    taken = root / "taken"  # another run folder holding a run, for demo (the two refusals run concurrently)
    taken.mkdir()
    (taken / "metrics.jsonl").write_bytes((run_dir / "metrics.jsonl").read_bytes())
    (checkpoint,) = (run_dir / "checkpoints").glob("*.pt")
    renamed = root / "copied-checkpoint.pt2"
    renamed.write_bytes(checkpoint.read_bytes())
    artifact = root / "model.pt2"
    trainwise.export(model, torch.randn(2, 3), artifact)
    torchscript = root / "model.torchscript"
    trainwise.export(model, torch.randn(2, 3), torchscript, "torchscript")
    arrays = {"x": (2, 3), "x_wrong": (2, 5), "x_big": (20000, 3)}
    for name, shape in arrays.items():
        np.save(root / f"{name}.npy", np.ones(shape, dtype=np.float32))
    (root / "empty.pt").write_bytes(b"")
    (root / "empty.pt2").write_bytes(b"")
    (root / "empty.torchscript").write_bytes(b"")
    (root / "keep.pt").write_bytes(b"a file convert must not replace")
    tb_run = root / "tb-run"  # its tensorboard/ a link to a folder nobody may write in, root included
    tb_run.mkdir()
    (tb_run / "tensorboard").symlink_to(UNWRITABLE_FOLDER or root / "missing")
    return {
        **plain_files,
        "run": str(run_dir),
        "taken": str(taken),
        "checkpoint": str(checkpoint),
        "renamed": str(renamed),
        "artifact": str(artifact),
        "torchscript": str(torchscript),
        "empty_torchscript": str(root / "empty.torchscript"),
        "empty_pt": str(root / "empty.pt"),
        "empty_pt2": str(root / "empty.pt2"),
        "keep": str(root / "keep.pt"),
        "tb_run": str(tb_run),
        **{name: str(root / f"{name}.npy") for name in arrays},
    }


@pytest.fixture(scope="module")
def slow_outcomes(torch_files):
    """Every slow case, run concurrently; the torch start-up of each child is most of its time."""
    before = {name: Path(torch_files[name]).read_bytes() for name in ("checkpoint", "renamed", "keep")}
    root = Path(torch_files["root"])
    workers = max(2, min(6, 2 * (os.cpu_count() or 1)))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        futures = {
            case.id: pool.submit(run, materialise(case, torch_files), root, closed_stdout=case.closed_stdout)
            for case in SLOW
            if (UNAVAILABLE is not None or "not-here" not in case.id) and _missing(case.id) is None
        }
        outcomes = {name: future.result() for name, future in futures.items()}
    after = {name: Path(torch_files[name]).read_bytes() for name in before}
    return outcomes, before == after


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW, ids=[case.id for case in SLOW])
def test_slow_user_errors(case, torch_files, slow_outcomes):
    outcomes, _ = slow_outcomes
    if case.id not in outcomes:
        pytest.skip(_missing(case.id) or "every device is available here")
    case = dataclasses.replace(
        case,
        contains=tuple(text.format(**torch_files) for text in case.contains),
        absent=tuple(text.format(**torch_files) for text in case.absent),
    )
    check(case, outcomes[case.id])


@pytest.mark.slow
def test_no_bad_input_changed_a_file(slow_outcomes):
    """The checkpoint, its renamed copy and the file convert was told not to replace are byte for byte intact."""
    assert slow_outcomes[1]


@pytest.mark.slow
def test_the_export_command_predict_names_works(torch_files, slow_outcomes):
    """Run the very commands the sentence names: the artifact they make predicts."""
    root = Path(torch_files["root"])
    outcome = slow_outcomes[0]["predict-training-checkpoint-format"]
    assert outcome.code == 2, outcome
    commands = re.findall(r"`([^`]+)`", outcome.err)
    assert [shlex.split(c)[:2] for c in commands] == [["trainwise", "export"], ["trainwise", "predict"]], outcome
    export, predict = (shlex.split(c)[1:] for c in commands)
    made = run(export, root)
    assert made.code == 0, made
    predicted = run([*predict, "--json"], root)
    assert predicted.code == 0 and '"argmax"' in predicted.out, predicted


def test_messages_in_cli_spelling():
    """The library's Python spelling, as each command says it (no torch needed: the rewrite alone)."""
    from trainwise.cli.spelling import cli_spelling

    device = "device 'cuda' was asked for but CUDA is not available; use device='auto'."
    assert cli_spelling(device, "demo").endswith("use --device auto.")
    assert cli_spelling(device, "fit").endswith("use device=auto.")
    taken = ("run folder r already holds a run; pass resume='auto' to continue it, another run_dir, or "
             "overwrite=True to move the old run aside.")
    assert cli_spelling(taken, "fit").endswith("pass resume=auto to continue it, another run_dir, or overwrite=true "
                                               "to move the old run aside.")
    assert cli_spelling(taken, "demo").endswith("pass another --run-dir, or --overwrite to move the old run aside.")
    assert cli_spelling("pass format= one of a, b.", "predict") == "pass --format one of a, b."
    assert cli_spelling("pass trust_code=True if you trust it.", "predict") == "pass --trust-code if you trust it."
    assert cli_spelling("use format='torchscript' or pass dynamic_batch=False.", "export") == (
        "use --format torchscript or pass --static-batch."
    )
    assert cli_spelling("num_workers=1000 is more than 8", "demo") == "--workers 1000 is more than 8"
    unchanged = "epochs=5 and model.kwargs.width=16 and strict=False"
    assert cli_spelling(unchanged, "fit") == unchanged  # already fit's spelling; strict is no fit option
    assert cli_spelling(device, None) == device


def test_a_broken_pipe_of_our_own_is_not_hidden(monkeypatch, capsys):
    """Only the reader of stdout going away ends quietly: a BrokenPipeError from anything else (a worker's pipe)
    is a real failure and still propagates."""
    from trainwise.cli import main

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("trainwise.cli.doctor.run", broken)
    with pytest.raises(BrokenPipeError):
        main(["doctor", "--list-rules"])  # stdout is pytest's capture, not a closed pipe


def test_a_data_factory_returning_a_list_is_one_sentence(tmp_path):
    """In-process: the check itself, for lists of datasets and of loaders (and a list of samples is data)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from trainwise.cli.fit import _check_not_a_list_of_datasets
    from trainwise.errors import TrainwiseError

    dataset = TensorDataset(torch.zeros(4, 3), torch.zeros(4))
    with pytest.raises(TrainwiseError, match=r"returned a list \(TensorDataset, TensorDataset\).*tuple \(train, val\)"):
        _check_not_a_list_of_datasets([dataset, dataset], "m:data")
    with pytest.raises(TrainwiseError, match=r"returned a list \(DataLoader, DataLoader, DataLoader\)"):
        _check_not_a_list_of_datasets([DataLoader(dataset)] * 3, "m:data")
    _check_not_a_list_of_datasets([(torch.zeros(3), 0), (torch.zeros(3), 1)], "m:data")  # samples: fine
    _check_not_a_list_of_datasets((dataset, dataset), "m:data")

