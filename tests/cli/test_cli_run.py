"""``trainwise run``: real, unchanged scripts run in a subprocess as ``python`` runs them, with every mistake the
runtime guards catch reported with its code and the script's line, and nothing said about a clean script."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "run_scripts"
RUN = [sys.executable, "-m", "trainwise", "run"]
TIMEOUT = 120
EXPECTED = ("TW102", "TW103", "TW104", "TW105", "TW108", "TW109", "TW113", "TW114")


def _marked_lines(path: Path) -> dict[str, int]:
    """``{"TW102": 22, ...}``: the line of each ``# TWxxx`` marker."""
    found = {}
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        match = re.search(r"# (TW\d{3})$", text)
        if match:
            found[match.group(1)] = number
    return found


def test_each_mistake_is_reported_with_its_code_at_the_scripts_line(tmp_path):
    script = tmp_path / "train.py"
    shutil.copy(SCRIPTS / "mistakes.py", script)
    lines = _marked_lines(script)
    assert sorted(lines) == list(EXPECTED)
    proc = subprocess.run([*RUN, "--format", "json", "--output", "report.json", "train.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "trained\n"  # the script's own output, untouched
    said = re.findall(r"^trainwise run: train\.py:(\d+): (TW\d{3}) ", proc.stderr, re.MULTILINE)
    assert sorted((code, int(line)) for line, code in said) == sorted(lines.items()), proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    seen = {entry["code"]: entry for entry in report if "run_line" in entry}
    assert {code: entry["run_line"] for code, entry in seen.items()} == lines
    assert all(entry["path"] == "train.py" for entry in report)
    # the doctor's findings come first, and the run confirms them: TW105 at the very line, the others where the
    # doctor names the cause (`total += loss`, `with torch.autocast`, `self.blocks = [...]`)
    static = re.findall(r"^trainwise run: doctor: train\.py:(\d+):\d+: (TW\d{3}) ", proc.stderr, re.MULTILINE)
    assert {code for _, code in static} == {"TW102", "TW105", "TW109", "TW114"}
    assert proc.stderr.index("doctor:") < proc.stderr.index(f"train.py:{lines['TW102']}: TW102")
    assert {e["code"]: e["found"] for e in report if e["found"] == "both"} == {
        "TW102": "both", "TW105": "both", "TW109": "both", "TW114": "both"}
    assert seen["TW105"]["line"] == seen["TW105"]["run_line"] == lines["TW105"]
    assert not [e for e in report if e["found"] == "static"]


CLEAN = '''\
"""A correct loop: it must run under `trainwise run` exactly as under python."""
import os
import sys

import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.1), nn.ReLU(), nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
losses = []
for step in range(4):
    model.train()
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
with open(sys.argv[1], "w") as fh:
    fh.write(" ".join(f"{v:.6f}" for v in losses) + f" {accuracy:.4f}\\n")
print(__name__, sys.argv, sys.path[0] == os.path.dirname(os.path.realpath(__file__)), __file__)
print("stdin:", sys.stdin.read().strip())
sys.exit(int(sys.argv[2]))
'''


def test_a_clean_script_runs_as_python_runs_it_and_reports_nothing(tmp_path):
    (tmp_path / "clean.py").write_text(CLEAN)
    ours = subprocess.run([*RUN, "clean.py", "ours.txt", "3"], cwd=tmp_path, input="hello\n",
                          capture_output=True, text=True, timeout=TIMEOUT)
    python = subprocess.run([sys.executable, "clean.py", "python.txt", "3"], cwd=tmp_path, input="hello\n",
                            capture_output=True, text=True, timeout=TIMEOUT)
    assert (ours.returncode, python.returncode) == (3, 3), ours.stderr
    assert ours.stdout == python.stdout.replace("python.txt", "ours.txt")
    assert "__main__ ['clean.py', 'ours.txt', '3'] True" in ours.stdout and "stdin: hello" in ours.stdout
    assert (tmp_path / "ours.txt").read_text() == (tmp_path / "python.txt").read_text()
    assert python.stderr == ""
    assert ours.stderr == "trainwise run: clean.py: no problems found, statically or at run time.\n"


ENDINGS = {
    "exception": ('def fail():\n    raise ValueError("no data")\nprint("before")\nfail()\n', 1),
    "exit message": ('import sys\nsys.exit("stopped: no data")\n', 1),
    "exit code": ('import sys\nprint("out")\nsys.exit(7)\n', 7),
    "keyboard interrupt": ('print("out")\nraise KeyboardInterrupt\n', -signal.SIGINT),  # python dies of SIGINT
}


@pytest.mark.slow
@pytest.mark.parametrize("ending", list(ENDINGS))
def test_the_scripts_ending_is_pythons(tmp_path, ending):
    source, status = ENDINGS[ending]
    (tmp_path / "end.py").write_text(source)
    ours = subprocess.run([*RUN, "--no-doctor", "end.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=TIMEOUT)
    python = subprocess.run([sys.executable, "end.py"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=TIMEOUT)
    assert ours.returncode == python.returncode == status
    assert ours.stdout == python.stdout
    # python's traceback or message, the same lines (the script's frames only), then trainwise's report
    assert ours.stderr.startswith(python.stderr), ours.stderr
    assert "trainwise/cli" not in ours.stderr and "runpy" not in ours.stderr


@pytest.mark.slow
def test_module_mode_and_fail_on(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(
        "import sys\nimport torch\n\nmodel = torch.nn.Linear(2, 1)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(3):\n    model(torch.ones(4, 2)).sum().backward()\n    optimizer.step()\n"
        "print(__name__, sys.argv[1:])\n")
    proc = subprocess.run([*RUN, "--fail-on", "TW105", "-m", "pkg.train", "--lr", "3"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.stdout == "__main__ ['--lr', '3']\n"
    assert "pkg/train.py:8: TW105" in proc.stderr
    assert proc.returncode == 1  # the script succeeded; --fail-on TW105 matched
    ignored = subprocess.run([*RUN, "--ignore", "TW105", "--fail-on", "any", "-m", "pkg.train"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=TIMEOUT)
    assert ignored.returncode == 0, ignored.stderr
    assert "TW105" not in ignored.stderr


@pytest.mark.parametrize(("argv", "says"), [
    (["missing.py"], "missing.py does not exist"),
    (["--select", "TW999", "x.py"], "--select: 'TW999' matches no rule or guard"),
    ([], "name the script to run"),
])
def test_usage_errors_are_one_line_and_exit_2(tmp_path, argv, says):
    (tmp_path / "x.py").write_text("")
    proc = subprocess.run([*RUN, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 2
    assert says in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.skipif(not (Path(sys.executable).parent / "trainwise").exists(), reason="no trainwise console script")
def test_the_console_script_puts_the_scripts_folder_first_on_sys_path(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "helper.py").write_text("NAME = 'helper beside the script'\n")
    (tmp_path / "sub" / "show.py").write_text(
        "import sys\nimport helper\nprint(sys.path[0], helper.NAME, sys.argv)\n")
    console = str(Path(sys.executable).parent / "trainwise")
    ours = subprocess.run([console, "run", "--no-doctor", "sub/show.py", "x"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=TIMEOUT)
    python = subprocess.run([sys.executable, "sub/show.py", "x"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=TIMEOUT)
    assert ours.returncode == python.returncode == 0, ours.stderr
    assert ours.stdout == python.stdout == f"{tmp_path / 'sub'} helper beside the script ['sub/show.py', 'x']\n"


def _line_of(path: Path, text: str) -> int:
    """The number of the only line of ``path`` that ends with ``text``."""
    found = [n for n, line in enumerate(path.read_text().splitlines(), start=1) if line.endswith(text)]
    assert len(found) == 1, (text, found)
    return found[0]


def _run_json(tmp_path: Path, *argv: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess,
                                                                                        list[dict]]:
    proc = subprocess.run([*RUN, "--format", "json", "--output", "report.json", *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads((tmp_path / "report.json").read_text())


def test_an_accelerate_loops_finding_is_placed_at_the_scripts_step_and_confirms_the_doctor(tmp_path):
    pytest.importorskip("accelerate")
    script = tmp_path / "train.py"
    shutil.copy(SCRIPTS / "accelerate_loop.py", script)
    step = _marked_lines(script)["TW102"]
    proc, report = _run_json(tmp_path, "train.py")
    assert proc.stdout == "trained\n"
    # the step runs inside accelerate's AcceleratedOptimizer.step: the line is the script's call of it
    assert re.findall(r"^trainwise run: (\S+): TW102 ", proc.stderr, re.MULTILINE) == [f"train.py:{step}"]
    assert "site-packages" not in proc.stderr and "accelerate/" not in proc.stderr
    assert [(e["code"], e["path"], e["line"], e["found"], e["run_line"]) for e in report] == [
        ("TW102", "train.py", _line_of(script, "total += loss"), "both", step)]


@pytest.mark.slow
def test_a_module_run_from_an_installed_package_is_placed_in_it_and_a_librarys_frames_are_not(tmp_path):
    site = tmp_path / "env" / "lib" / "site-packages"  # an installed package, as pip lays it out
    (site / "trainpkg").mkdir(parents=True)
    (site / "trainpkg" / "__init__.py").write_text("")
    (site / "steplib.py").write_text("def step(optimizer):\n    optimizer.step()\n")  # a library that steps
    (site / "trainpkg" / "train.py").write_text(
        "import torch\nimport steplib\n\nmodel = torch.nn.Linear(2, 1)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(3):\n    model(torch.ones(4, 2)).sum().backward()\n    steplib.step(optimizer)  # TW105\n")
    paths = [str(site), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    proc, report = _run_json(tmp_path, "-m", "trainpkg.train", env=env)
    line = _marked_lines(site / "trainpkg" / "train.py")["TW105"]
    shown = os.path.join("env", "lib", "site-packages", "trainpkg", "train.py")
    assert re.findall(r"^trainwise run: (\S+): TW105 ", proc.stderr, re.MULTILINE) == [f"{shown}:{line}"]
    assert [(e["code"], e["path"], e["run_line"]) for e in report if e["found"] != "static"] == [
        ("TW105", shown, line)]


def test_the_run_confirms_the_doctors_finding_on_the_path_that_ran_not_in_a_function_never_called(tmp_path):
    script = tmp_path / "train.py"
    shutil.copy(SCRIPTS / "unused_function.py", script)
    step = _marked_lines(script)["TW102"]
    ran, never = _line_of(script, "# confirmed"), _line_of(script, "# static only")
    assert never < ran  # the function's finding comes first in the file, and is nearer by no measure but order
    proc, report = _run_json(tmp_path, "train.py")
    static = re.findall(r"^trainwise run: doctor: train\.py:(\d+):\d+: TW102 ", proc.stderr, re.MULTILINE)
    assert sorted(map(int, static)) == [never, ran]  # the doctor finds both
    assert sorted((e["line"], e["found"], e.get("run_line")) for e in report if e["code"] == "TW102") == [
        (never, "static", None), (ran, "both", step)]


def _interrupt(argv: list[str], cwd: Path) -> tuple[int, str, str]:
    """Run ``argv``, send it SIGINT once the script says it is training, and return how it ended."""
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        if first == "training\n":
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
        proc.wait()
    return proc.returncode, first + out, err


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_script_stopped_by_sigint_dies_of_sigint_as_under_python_after_the_report(tmp_path):
    script = tmp_path / "train.py"
    shutil.copy(SCRIPTS / "interrupted.py", script)
    python = _interrupt([sys.executable, "train.py"], tmp_path)
    ours = _interrupt([*RUN, "train.py"], tmp_path)
    assert python[0] == -signal.SIGINT  # what a parent's WIFSIGNALED / WTERMSIG sees
    assert ours[0] == python[0], ours[2]
    assert ours[1] == python[1] == "training\natexit: saved\n"  # the script's atexit handlers ran, as under python
    assert python[2].endswith("\nKeyboardInterrupt\n")
    traceback, _, report = ours[2].partition("\nKeyboardInterrupt\n")
    assert "trainwise/cli" not in traceback and "runpy" not in traceback
    step = _marked_lines(script)["TW105"]
    assert f"trainwise run: train.py:{step}: TW105 " in traceback  # said live, before the interrupt
    assert report.startswith("trainwise run: train.py was interrupted (KeyboardInterrupt)"), report
    assert "TW105  train.py:" in report  # the report, printed before the process kills itself


def test_a_folder_without_main_fails_in_one_line_as_under_python(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "train.py").write_text("print('never run')\n")
    python = subprocess.run([sys.executable, "app"], cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT)
    ours = subprocess.run([*RUN, "app"], cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT)
    said = f"can't find '__main__' module in {str(tmp_path / 'app')!r}"
    assert python.stderr == f"{sys.executable}: {said}\n"
    assert (ours.returncode, ours.stdout) == (python.returncode, python.stdout) == (1, "")
    assert ours.stderr.startswith(f"trainwise run: {said}; ") and len(ours.stderr.splitlines()) == 1, ours.stderr


@pytest.mark.slow
def test_a_folder_or_zip_file_with_main_runs_as_under_python(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__main__.py").write_text(
        "import sys\nimport torch\n\nmodel = torch.nn.Linear(2, 1)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(3):\n    model(torch.ones(4, 2)).sum().backward()\n    optimizer.step()\n"
        "print(__name__, sys.argv)\n")
    with zipfile.ZipFile(tmp_path / "app.zip", "w") as archive:
        archive.write(tmp_path / "app" / "__main__.py", "__main__.py")
    said = {}
    for target in ("app", "app.zip"):
        python = subprocess.run([sys.executable, target, "x"], cwd=tmp_path, capture_output=True, text=True,
                                timeout=TIMEOUT)
        ours = subprocess.run([*RUN, target, "x"], cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT)
        assert ours.returncode == python.returncode == 0, ours.stderr
        assert ours.stdout == python.stdout == f"__main__ ['{target}', 'x']\n"
        assert "TW900" not in ours.stderr and ": TW105 " in ours.stderr
        said[target] = ours.stderr
    # the doctor reads the folder's __main__.py (a zip file's members it cannot read)
    assert re.search(r"^trainwise run: doctor: app/__main__\.py:8:\d+: TW105 ", said["app"], re.MULTILINE), said["app"]


def _json_report(tmp_path: Path, *argv: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """``trainwise run --format json`` on ``argv`` in ``tmp_path``: the process and the report's entries."""
    report = tmp_path / "report.json"
    report.unlink(missing_ok=True)
    proc = subprocess.run([*RUN, "--format", "json", "--output", str(report), *argv], cwd=tmp_path,
                          capture_output=True, text=True, timeout=TIMEOUT)
    return proc, json.loads(report.read_text()) if report.exists() else []


LOAD_IN_PLAIN_PYTHON = '''\
"""The saved model loaded where trainwise is not installed: the file must need nothing of it."""
import sys
sys.modules["trainwise"] = None  # any import of trainwise now fails
import torch
import rnn_model

model = torch.load(sys.argv[1], weights_only=False)
fresh = rnn_model.RNNModel()
fresh.load_state_dict(torch.load(sys.argv[1] + ".state"))
for loaded, plain in zip(model.modules(), fresh.modules()):
    assert sorted(vars(loaded)) == sorted(vars(plain)), set(vars(loaded)) ^ set(vars(plain))
    assert not (loaded._forward_hooks or loaded._forward_pre_hooks), type(loaded).__name__
x, hidden = torch.randint(0, 20, (5, 4)), fresh.init_hidden(4)
assert torch.equal(model.eval()(x, hidden)[0], fresh.eval()(x, hidden)[0])
print("loaded")
'''


def test_a_whole_model_saved_with_torch_save_loads_in_plain_python(tmp_path):
    """pytorch/examples' word_language_model: torch.save(model, f) of the best model, a deep copy, a pickle, and
    the file loaded back by the script and by a python without trainwise."""
    for name in ("rnn_model.py", "rnn_main.py"):
        shutil.copy(SCRIPTS / name, tmp_path / name)
    proc = subprocess.run([*RUN, "--ignore", "TW301", "rnn_main.py", "--save", "model.pt"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"best [\d.]+ reloaded [\d.]+ RNNModel RNNModel\n", proc.stdout), proc.stdout
    assert proc.stderr == "trainwise run: rnn_main.py: no problems found, statically or at run time.\n"
    assert b"trainwise" not in (tmp_path / "model.pt").read_bytes()  # the zip's pickle is stored uncompressed
    (tmp_path / "load.py").write_text(LOAD_IN_PLAIN_PYTHON)
    loaded = subprocess.run([sys.executable, "load.py", "model.pt"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=TIMEOUT)
    assert (loaded.returncode, loaded.stdout) == (0, "loaded\n"), loaded.stderr


@pytest.mark.slow
def test_a_model_passed_to_a_spawned_process_trains_there(tmp_path):
    """pytorch/examples' mnist_hogwild with the spawn start method: the model, evaluated (so guarded) first, is
    pickled to the worker, which trains the shared weights."""
    shutil.copy(SCRIPTS / "hogwild.py", tmp_path / "hogwild.py")
    proc = subprocess.run([*RUN, "hogwild.py", "1"], cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "workers [0] trained True\n"
    assert proc.stderr == "trainwise run: hogwild.py: no problems found, statically or at run time.\n"


DIES = '''\
import torch
from torch.nn import functional as F

model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    optimizer.zero_grad()
    F.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 2, (8,))).backward()
    optimizer.step()
raise RuntimeError("disk full")
'''


def test_a_script_that_dies_is_said_to_have_failed_never_to_be_clean(tmp_path):
    (tmp_path / "dies.py").write_text(DIES)
    proc = subprocess.run([*RUN, "dies.py"], cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 1
    traceback, _, said = proc.stderr.rpartition("RuntimeError: disk full\n")
    assert traceback.startswith("Traceback")
    assert "no problems found" not in said
    assert said == ("trainwise run: dies.py: the script failed (RuntimeError: disk full); nothing found until then "
                    "(1 model watched over 3 steps).\n")


def test_each_mistake_is_found_at_the_same_step_with_the_optimizer_local_to_main_or_global(tmp_path):
    """The guard first meets the model before its optimizer when the optimizer is a local of main() (read only at
    its first step): the first step's checks must not be lost (TW102 at step 3, TW109 at step 0, as docs say)."""
    shutil.copy(SCRIPTS / "layouts.py", tmp_path / "layouts.py")
    steps = {}
    for layout in ("module", "main"):
        proc, report = _json_report(tmp_path, "layouts.py", layout)
        assert proc.returncode == 0 and proc.stdout == "trained\n", proc.stderr
        steps[layout] = {entry["code"]: (entry["found"], entry.get("step")) for entry in report}
    assert steps["main"] == steps["module"] == {"TW102": ("both", 3), "TW105": ("both", 1), "TW109": ("both", 0)}


def test_a_loop_without_an_optimizer_is_checked_with_backward_as_its_step(tmp_path):
    """word_language_model's manual update (p.data.add_(p.grad, alpha=-lr)) with the hidden state never detached:
    every step backpropagates through all the earlier ones; found at the third step, as with an optimizer."""
    for name in ("rnn_model.py", "rnn_main.py"):
        shutil.copy(SCRIPTS / name, tmp_path / name)
    proc, report = _json_report(tmp_path, "--ignore", "TW301", "rnn_main.py", "--keep-hidden")
    assert proc.returncode == 0, proc.stderr
    lines = (tmp_path / "rnn_main.py").read_text().splitlines()
    train = lines.index("def train():")
    forward = next(n for n, line in enumerate(lines[train:], start=train + 1) if "= model(data, hidden)" in line)
    # said at the forward that starts step 3 (the step after the third backward)
    assert [(e["code"], e["found"], e["step"], e["line"]) for e in report] == [("TW102", "run", 3, forward)]
