"""Seeded, structure-aware fuzzing of what the doctor reads: notebooks, ``pyproject.toml`` and Python files.

Each case starts from real inputs (the rule fixtures, valid notebooks and configuration tables) and mutates
them at the level that matters (JSON types, TOML values, lines and tokens, then bytes). Whatever the input,
``trainwise doctor`` (run in-process, rules strict: a rule that raises fails the test) must end, print no
traceback, let no exception escape, exit 0, 1 or 2, and say a user error in one line with exit 2. It never
runs the code it reads: a case whose code would create a marker file if it ran checks that it does not.

Reproduce one case with its id, e.g. ``-k "notebook and 17"``; ``TRAINWISE_FUZZ_SEED`` changes every case.
"""

from __future__ import annotations

import codecs
import json
import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from trainwise.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
SEED = int(os.environ.get("TRAINWISE_FUZZ_SEED", "1729"))
CASE_SECONDS = 20  # one case that takes longer than this counts as a hang
MARKER = "TRAINWISE_FUZZ_RAN"

FIXTURE_SCRIPTS = sorted(p.read_text(encoding="utf-8") for p in FIXTURES.glob("*/*.py"))
FIXTURE_NOTEBOOKS = sorted(p.read_text(encoding="utf-8") for p in FIXTURES.glob("*/*.ipynb"))


def _marker_code(folder: Path) -> str:
    """Python that leaves a file behind if it ever runs."""
    return f"open({str(folder / MARKER)!r}, 'w').write('ran')\n"


# ------------------------------------------------------------------------------------------------ building blocks
SCALARS = [None, True, False, 0, -1, 2**70, 1.5, float("inf"), "", "code", "markdown", "x" * 3000, "\ud800",
           "\u2028", "\x00", "%%time", "!ls", "import torch\n"]


def random_json(rng: random.Random, depth: int = 0):
    """A random JSON value (kept shallow; deep nesting is built as text elsewhere)."""
    kind = rng.randrange(6 if depth < 3 else 3)
    if kind <= 2:
        return rng.choice(SCALARS)
    if kind == 3:
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 4:
        return {rng.choice(["cell_type", "source", "metadata", "cells", "outputs", "x"]): random_json(rng, depth + 1)
                for _ in range(rng.randrange(4))}
    return rng.choice(["\ud800\udc00", "é", "\u2029", "\x85", "\x0c", "\x1c"]) * rng.randrange(1, 4)


CODE_LINES = [
    "import torch", "import torch.nn as nn", "from torch.utils.data import DataLoader",
    "loader = DataLoader(ds, batch_size=32)", "model = nn.Linear(2, 2)", "model.requires_grad = False",
    "for x, y in loader:", "    loss = criterion(model(x), y)", "    loss.backward()", "    opt.step()",
    "    total += loss", "    correct += (model(x).argmax(1) == y).sum().item()", "print(correct / len(loader))",
    "ckpt = torch.load('a.pt')", "model.load_state_dict(sd, strict=False)", "model.eval()", "with torch.no_grad():",
    "    pass", "opt.zero_grad()", "%matplotlib inline", "!pip install x", "x = 'a\u2028b'", "def f(:", "  bad indent",
    "s = '''", "'''", "\t\tmixed", "é = 1", "x = \\", "", "# comment", "@decorator", "class M(nn.Module):",
    "    def forward(self, x):", "        return x", "lambda: (yield)", "async def g():", "    await h()",
]


JUNK = ["\u2028", "\x0c", "\x00", "\x85", "'", '"', "(", ")", ":", "\\"]


def _script(rng: random.Random, lines: int) -> str:
    return "\n".join(rng.choice(CODE_LINES) for _ in range(lines)) + rng.choice(["", "\n"])


def mutate_text(rng: random.Random, text: str) -> str:
    """Line- and token-level edits that keep much of a script's structure (so that many still parse)."""
    lines = text.split("\n")
    for _ in range(rng.randrange(1, 5)):
        op = rng.randrange(8)
        i = rng.randrange(len(lines)) if lines else 0
        if op == 0 and lines:
            del lines[i]
        elif op == 1 and lines:
            lines.insert(i, lines[rng.randrange(len(lines))])
        elif op == 2 and len(lines) > 1:
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == 3:
            lines.insert(i, rng.choice(CODE_LINES))
        elif op == 4 and lines:
            lines[i] = lines[i].replace(rng.choice(["loader", "model", "loss", "torch", "x", "("]),
                                        rng.choice(["dl", "net", "l", "th", "y", "[", ""]))
        elif op == 5 and lines:
            lines[i] = " " * rng.randrange(9) + lines[i].lstrip()
        elif op == 6 and lines:
            cut = rng.randrange(len(lines[i]) + 1)
            lines[i] = lines[i][:cut] + rng.choice(JUNK) + \
                lines[i][cut:]
        else:
            lines = lines[: rng.randrange(len(lines) + 1)]
    return rng.choice(["\n", "\n", "\r\n", "\r"]).join(lines)


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        op = rng.randrange(6)
        pos = rng.randrange(len(data) + 1)
        if op == 0 and data:
            data[min(pos, len(data) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:
            data = data[:pos]
        elif op == 2:
            data[pos:pos] = rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\xef\xbb\xbf", b"\r", b"\x1b"])
        elif op == 3:
            data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
        elif op == 4:
            data = bytearray(b"\xef\xbb\xbf") + data
        else:
            data += data[: rng.randrange(len(data) + 1)]
    return bytes(data)


# ------------------------------------------------------------------------------------------------ cases
def notebook_case(rng: random.Random, folder: Path) -> dict[str, bytes]:
    if FIXTURE_NOTEBOOKS and rng.random() < 0.5:
        notebook = json.loads(rng.choice(FIXTURE_NOTEBOOKS))
    else:
        cells = []
        for _ in range(rng.randrange(1, 6)):
            source = _script(rng, rng.randrange(1, 8))
            cells.append({"cell_type": rng.choice(["code", "code", "markdown", "raw"]), "metadata": {},
                          "source": source.splitlines(keepends=True) if rng.random() < 0.5 else source,
                          "outputs": [], "execution_count": None})
        notebook = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    if rng.random() < 0.15:  # the notebook's code would leave a marker if it ran
        notebook.setdefault("cells", []).append({"cell_type": "code", "source": _marker_code(folder)})
    kind = rng.randrange(10)
    cells = notebook.get("cells") if isinstance(notebook.get("cells"), list) else []
    if kind == 0:
        notebook["cells"] = random_json(rng)
    elif kind == 1 and cells:
        cells[rng.randrange(len(cells))] = random_json(rng)
    elif kind == 2 and cells:
        cell = cells[rng.randrange(len(cells))]
        if isinstance(cell, dict):
            cell[rng.choice(["cell_type", "source", "metadata", "outputs"])] = random_json(rng)
    elif kind == 3 and cells:
        cell = cells[rng.randrange(len(cells))]
        if isinstance(cell, dict):
            source = cell.get("source")
            text = "".join(map(str, source)) if isinstance(source, list) else str(source)
            text = mutate_text(rng, text)
            cell["source"] = text.splitlines(keepends=True) if rng.random() < 0.5 else text
    elif kind == 4:
        notebook["metadata"] = random_json(rng)
    elif kind == 5:  # very many cells
        notebook["cells"] = [{"cell_type": "code", "source": rng.choice(CODE_LINES)} for _ in range(1500)]
    data = json.dumps(notebook, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
    if kind == 6:  # nested far deeper than any parser recursion limit
        depth = rng.choice([1000, 10_000, 100_000])
        where = rng.choice(["cells", "source", "metadata"])
        nested = b"[" * depth + b"]" * depth
        if where == "cells":
            data = b'{"cells": ' + nested + b"}"
        elif where == "source":
            data = b'{"cells": [{"cell_type": "code", "source": ' + nested + b"}]}"
        else:
            data = b'{"metadata": ' + b'{"a":' * depth + b"1" + b"}" * depth + b', "cells": []}'
    elif kind == 7:
        data = mutate_bytes(rng, data)
    elif kind == 8:
        utf16 = data.decode("utf-8", "surrogatepass").encode("utf-16", "surrogatepass")
        data = rng.choice([codecs.BOM_UTF8 + data, utf16, data[: rng.randrange(len(data) + 1)], b"", b"null", b"[]",
                           b'"cells"'])
    return {rng.choice(["nb.ipynb", "sub/deep.ipynb", "odd name.ipynb"]): data}


CONFIG_VALUES = ["5", '"TW1"', '["TW1"]', '["TW999"]', "[1, 2]", '["TW1", 2]', "true", "{a = 1}", "[[1]]", "1979-05-27",
                 "3.5", "inf", "nan", '"[z-a]"', '["[]", "\\\\", "[a-", "[z-a]", "**/", "!x"]', "[]", '["ALL"]',
                 '["tw1, TW3"]', '["", " "]', '["\\u2028"]', "'''\nTW1'''", '["TW1",]', "{}", '[{ a = 1 }]']
CONFIG_KEYS = ["select", "ignore", "exclude", "unsafe-fixes", "per-file-ignores", "extend-select", '"" ', "SELECT"]


def pyproject_case(rng: random.Random, folder: Path) -> dict[str, bytes]:
    body = "".join(f"{rng.choice(CONFIG_KEYS)} = {rng.choice(CONFIG_VALUES)}\n" for _ in range(rng.randrange(4)))
    value = rng.choice(CONFIG_VALUES)
    layout = rng.randrange(8)
    toml = [
        f"[tool.trainwise.doctor]\n{body}",
        f"[project]\nname = 'x'\ndependencies = ['trainwise']\n\n[tool.trainwise.doctor]\n{body}",
        f"[tool.trainwise]\ndoctor = {value}\n",
        f"[tool]\ntrainwise = {value}\n",
        f"tool = {value}\n# trainwise\n",
        f"[[tool.trainwise.doctor]]\n{body}",
        f"[tool.trainwise.doctor]\n{body}[tool.trainwise.doctor.sub]\nx = 1\n",
        f"[tool.trainwise.doctor]\nselect = {'[' * rng.choice([100, 1000, 5000])}\n",
    ][layout]
    data = toml.encode("utf-8")
    mutation = rng.randrange(5)
    if mutation == 0:
        data = mutate_bytes(rng, data)
    elif mutation == 1:
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(200))) + b"tool.trainwise" + \
            bytes(rng.randrange(256) for _ in range(rng.randrange(200)))
    files = {"pyproject.toml": data, "train.py": rng.choice(FIXTURE_SCRIPTS).encode()}
    if rng.random() < 0.3:
        files[".gitignore"] = "\n".join(rng.choice(["[]]", "[]", "[!]", "\\", "[a-", "**/", "!x", "[z-a]", "*.py",
                                                    "!train.py", "sub/", "#c", " ", "[[:alpha:]]"])
                                        for _ in range(rng.randrange(1, 5))).encode()
    return files


def python_case(rng: random.Random, folder: Path) -> dict[str, bytes]:
    kind = rng.randrange(9)
    if kind <= 2:  # a real training script, mutated
        text = mutate_text(rng, rng.choice(FIXTURE_SCRIPTS)) if kind else rng.choice(FIXTURE_SCRIPTS)
        data = text.encode("utf-8", "surrogatepass")
    elif kind == 3:
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(4000)))
    elif kind == 4:  # nested deeper than Python's parser (and libcst's) allows
        n = rng.choice([50, 199, 500, 3000, 10_000])
        opening, closing = rng.choice([("(", ")"), ("[", "]"), ("{", "}"), ("-", ""), ("not ", ""), ("lambda: ", ""),
                                       ("f(", ")"), ("1 if x else ", ""), ("~", ""), ("x[", "]")])
        tail = rng.choice([".a" * n, "()" * n, "[0]" * n, ""])
        data = f"import torch\nmodel = torch.nn.Linear(2, 2)\nmodel.requires_grad = False\ny = {opening * n}1" \
               f"{closing * n}{tail}\n".encode()
    elif kind == 5:  # deep indentation, huge lines
        depth = rng.choice([50, 99, 101, 300])
        nested = "".join(f"{' ' * i}if x:\n" for i in range(depth)) + " " * depth + "torch.load('a')\n"
        data = rng.choice([nested, "x = '" + "a" * rng.choice([10_000, 1_000_000]) + "'\n",
                           "x = [" + "1, " * 100_000 + "]\n", "torch.load('a'); " * 5000 + "\n"]).encode()
    elif kind == 6:  # encodings and line breaks
        text = _script(rng, rng.randrange(1, 20))
        encoding = rng.choice(["utf-8", "utf-8-sig", "latin-1", "cp1252", "utf-16"])
        cookie = rng.choice(["", f"# -*- coding: {encoding} -*-\n", "# coding: klingon\n", "# coding=utf-8\n"])
        data = (cookie + text).replace("\n", rng.choice(["\n", "\r\n", "\r"])).encode(encoding, "replace")
    elif kind == 7:  # null bytes and control characters in a valid script
        text = rng.choice(FIXTURE_SCRIPTS)
        pos = rng.randrange(len(text) + 1)
        data = (text[:pos] + rng.choice(["\x00", "\x1a", "\x0c", "\x1b", "\u2028", "\ufeff"]) + text[pos:]).encode()
    else:  # valid code that would leave a marker if the doctor ran it
        data = ("import torch\n" + _marker_code(folder) + "model = torch.nn.Linear(2, 2)\nmodel.requires_grad = False\n"
                "torch.load('a.pt')\n").encode()
    name = rng.choice(["train.py", "sub/train.py", "é.py", "torch.py", "__init__.py", "conftest.py"])
    return {name: data}


KINDS = {"notebook": (notebook_case, 110), "pyproject": (pyproject_case, 90), "python": (python_case, 120)}
CASES = [(kind, i) for kind, (_, count) in KINDS.items() for i in range(count)]


# ------------------------------------------------------------------------------------------------ running
class _Hang(Exception):
    pass


def _call_with_deadline(argv: list[str], seconds: int) -> int:
    """``main(argv)``, interrupted by SIGALRM if it runs past ``seconds`` (where signals are available)."""
    use_alarm = hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()
    if use_alarm:
        def on_alarm(signum, frame):
            raise _Hang(f"still running after {seconds} s")

        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.alarm(seconds)
    try:
        return main(argv)
    finally:
        if use_alarm:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("kind, index", CASES, ids=[f"{k}-{i}" for k, i in CASES])
def test_fuzzed_input(kind, index, tmp_path, monkeypatch, capsys):
    rng = random.Random(f"{SEED}-{kind}-{index}")
    folder = tmp_path / "project"
    folder.mkdir()
    files = KINDS[kind][0](rng, folder)
    for name, data in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    monkeypatch.chdir(folder)
    argv = ["doctor"]
    mode = rng.randrange(10)
    if mode == 0:
        argv.append("--diff")
    elif mode == 1:
        argv += ["--fix", "--unsafe-fixes"]
    elif mode == 2:
        argv.append("--fix")
    argv += ["--format", rng.choice(["text", "text", "json", "sarif", "github"])]
    argv += rng.choice([[], ["."], sorted(files)])
    where = f"case {kind}-{index} (seed {SEED}): trainwise {' '.join(argv)} on {sorted(files)}"

    try:
        code = _call_with_deadline(argv, CASE_SECONDS)
    except BaseException as exc:  # any exception that escapes is a failure, a hang too
        pytest.fail(f"{where}: {type(exc).__name__}: {str(exc)[:300]}")
    out, err = capsys.readouterr()
    assert code in (0, 1, 2), where
    assert "Traceback" not in out + err, where
    if code == 2:
        assert out == "", where
        assert err.count("\n") == 1 and err.startswith("trainwise doctor: error: "), f"{where}: {err!r}"
    else:
        assert err == "" or argv[1] == "--diff", f"{where}: {err!r}"
    assert not (folder / MARKER).exists(), f"{where}: the doctor ran the code it checked"


@pytest.mark.slow
def test_the_doctor_never_runs_the_code_it_checks(tmp_path):
    """Modules named like the ones the doctor imports lazily (``libcst`` for --fix, ``tomllib`` for the
    configuration), the checked script, a notebook cell, conftest.py and the like: none of them may run, with
    the console script or with ``python -m`` (which puts the current folder first on sys.path)."""
    folder = tmp_path / "project"
    folder.mkdir()
    marker = _marker_code(folder)
    for name in ("libcst.py", "train.py", "torch.py", "conftest.py", "setup.py", "__init__.py", "sitecustomize.py",
                 "usercustomize.py", "__main__.py"):
        (folder / name).write_text(
            marker + "import torch\nmodel = torch.nn.Linear(2, 2)\nmodel.requires_grad = False\ntorch.load('a')\n")
    (folder / "nb.ipynb").write_text(json.dumps({"cells": [{"cell_type": "code", "source": marker}]}))
    (folder / "pyproject.toml").write_text('[tool.trainwise.doctor]\nselect = ["TW1", "TW3"]\n')
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    console = Path(sys.executable).with_name("trainwise")
    commands = [[sys.executable, "-m", "trainwise.cli"]] + ([[str(console)]] if console.exists() else [])
    for command in commands:
        for flags in (["--diff", "--unsafe-fixes"], ["--fix", "--unsafe-fixes"], []):
            proc = subprocess.run([*command, "doctor", *flags, "."], cwd=folder, env=env, capture_output=True,
                                  text=True, timeout=300)
            assert proc.returncode in (0, 1), proc.stderr
            assert "Traceback" not in proc.stderr
            assert not (folder / MARKER).exists(), f"{command} {flags} ran the checked code"
