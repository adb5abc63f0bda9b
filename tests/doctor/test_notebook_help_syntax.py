"""Notebooks: only a line that is entirely IPython help (``obj?``, ``obj??``, ``?obj``, ``%pinfo obj``) at the
start of a statement is taken out; a ``?`` in a comment or a string, or on a line that continues an open
bracket, a string or a backslash, is Python and stays (it used to blank the line and lose the cell to TW900)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainwise.doctor.engine import check_file
from trainwise.doctor.notebook import join_cells


def _lines(text: str) -> list[str]:
    """A cell's source as Jupyter stores it: a list of lines, each with its newline but the last."""
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])


def _notebook(*cells: tuple[str, str]) -> str:
    """An nbformat 4 notebook, as Jupyter writes it, from (cell type, source) pairs."""
    out = []
    for i, (kind, text) in enumerate(cells, start=1):
        cell: dict[str, object] = {"cell_type": kind, "metadata": {}, "source": _lines(text)}
        if kind == "code":
            cell.update(execution_count=i, outputs=[], id=f"cell-{i}")
        out.append(cell)
    return json.dumps(
        {
            "cells": out,
            "metadata": {
                "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                "language_info": {"name": "python", "version": "3.10.12"},
            },
            "nbformat": 4,
            "nbformat_minor": 5,
        },
        indent=1,
    )


def _check(tmp_path: Path, *cells: tuple[str, str]) -> list[tuple[str, int | None, int]]:
    path = tmp_path / "lesson.ipynb"
    path.write_text(_notebook(*cells), encoding="utf-8")
    return [(f.code, f.cell, f.line) for f in check_file(str(path)).findings]


IMPORTS = """import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader"""

# A course notebook: questions to the student in comments, docstrings and strings, inside and outside brackets.
MODEL_CELL = """model = nn.Sequential(
    nn.Flatten(),
    nn.Linear(28 * 28, 128),  # what size should the hidden layer be?
    nn.ReLU(),
    nn.Linear(128, 10),  # how many classes?
)
state = torch.load("mnist_mlp.pt")"""

QUESTIONS_CELL = '''# Is the model on the GPU?
device = "cuda" if torch.cuda.is_available() else "cpu"  # or mps?
def accuracy(logits, y):
    """What fraction of the predictions is right?
    Why do we take the argmax?
    """
    return (logits.argmax(1) == y).float().mean()
print("Did the loss go down?")
print(f"lr={1e-3}, really?",
      "batch size 64?")
best = (accuracy
        if device == "cuda" else None)  # why?
total = 0 + \\
    1  # one more?
msg = ("epoch %d"
       % 3)
ckpt = torch.load("best.pt")'''


def test_question_marks_in_comments_strings_and_brackets_are_kept(tmp_path):
    found = _check(tmp_path, ("markdown", "# Lesson 3: an MLP on MNIST"), ("code", IMPORTS), ("code", MODEL_CELL),
                   ("code", QUESTIONS_CELL))
    assert found == [("TW301", 3, 7), ("TW301", 4, 17)]  # the cells parse and their findings are kept


def test_no_line_of_python_is_blanked():
    source = join_cells([(1, MODEL_CELL), (2, QUESTIONS_CELL)]).source
    assert source == MODEL_CELL + "\n" + QUESTIONS_CELL + "\n"


HELP_CELL = """nn.Linear?
torch.optim.SGD??
?F.cross_entropy
??DataLoader
%pinfo model
%pinfo2 nn.Module
model[0].weight?
model.parameters ?
for p in model.parameters():
    p?
sd = torch.load("weights.pt")  # what is in here?
model.load_state_dict(sd, strict=False)"""


def test_real_help_lines_are_still_taken_out(tmp_path):
    joined = join_cells([(1, HELP_CELL)]).source.split("\n")
    assert joined[:10] == ["pass"] * 8 + ["for p in model.parameters():", "    pass"]
    assert joined[10:12] == HELP_CELL.split("\n")[10:12]
    found = _check(tmp_path, ("code", IMPORTS), ("code", "model = nn.Linear(4, 2)"), ("code", HELP_CELL))
    assert found == [("TW301", 3, 11), ("TW302", 3, 12)]


@pytest.mark.parametrize(
    "line",
    [
        "x = 1  # why?",
        "print('why?')",
        'title = "Which optimizer?"',
        "labels = ['cat?', 'dog?']",
        "# ?",
        "#%% a cell marker?",
        "s = r'\\d+?'",
    ],
)
def test_a_question_mark_outside_code_is_not_help(line):
    assert join_cells([(1, line)]).source == line + "\n"


@pytest.mark.parametrize(
    "cell",
    [
        "layers = [\n    nn.Linear(10, 10),  # deeper?\n    ?\n]",  # inside brackets: Python's error, not help
        'doc = """\nmodel?\n"""',
        "doc = '''\n%pinfo model\n!ls\n'''",
        "x = 'a\\\nb?'",
        "y = (1 +\n     2)\nz = [\n!ls\n]",
    ],
)
def test_lines_that_continue_a_statement_are_never_magics(cell):
    assert join_cells([(1, cell)]).source == cell + "\n"


def test_magics_and_shell_lines_still_handled(tmp_path):
    cell = "!pip install -q torchvision\nfiles = !ls data\n%matplotlib inline\nimport torch\nsd = torch.load('a.pt')"
    joined = join_cells([(1, cell)]).source.split("\n")
    assert joined[:3] == ["pass", "pass", "pass"]
    assert _check(tmp_path, ("code", cell)) == [("TW301", 1, 5)]


def test_each_cell_starts_fresh(tmp_path):
    # an unclosed bracket in a broken cell does not turn the next cell's help line into code
    broken = ("code", "import torch\nx = torch.zeros(3,")
    found = _check(tmp_path, broken, ("code", "torch.load?\nsd = torch.load('a')"))
    assert found == [("TW900", 1, 2), ("TW301", 2, 2)]
