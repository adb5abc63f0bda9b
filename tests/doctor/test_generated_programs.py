"""Generated programs (hypothesis): the doctor never crashes, and gives the same answer twice."""

from __future__ import annotations

import ast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainwise.doctor.engine import check_source

NAMES = ["model", "net", "loader", "train_loader", "dl", "loss", "total", "losses", "optimizer", "opt", "x", "y",
         "correct", "self.model", "self.loader", "criterion", "outputs", "cudnn", "torch", "p", "batch"]
EXPRS = [
    "model(x)", "criterion(outputs, y)", "loss.item()", "len(loader)", "len(loader.dataset)",
    "(outputs.argmax(1) == y).sum().item()", "torch.load('a.pt')", "torch.load(p, weights_only=False)",
    "DataLoader(ds, batch_size=8)", "DataLoader(ds)", "nn.Linear(2, 3)", "torch.optim.SGD(model.parameters())",
    "correct / len(loader)", "100 * correct / len(train_loader)", "total + loss", "[]", "0", "0.0", "False",
    "True", "f'{correct / len(dl):.2f}'", "model.load_state_dict(sd, strict=False)", "loss.mean() * x.size(0)",
]
STATEMENTS = [
    "{n} = {e}", "{n} += {e}", "{n} /= {e}", "{n}.append({e})", "{n}.backward()", "{n}.zero_grad()", "{n}.step()",
    "{n}.requires_grad = False", "{n}.deterministic = True", "{n}.benchmark = True", "print({e})", "{e}",
    "del {n}", "return {e}", "scaler.step({n})", "{n}, {n} = {e}, {e}",
]
HEADERS = [
    "for {n} in {e}:", "while {e}:", "with torch.no_grad():", "with torch.inference_mode():", "if {e}:",
    "def f({n}):", "@torch.no_grad()\ndef g():", "class C(nn.Module):\n    def m(self):", "try:", "async def h():",
]
IMPORTS = [
    "import torch", "import torch.nn as nn", "from torch.utils.data import DataLoader as DataLoader",
    "import torch.backends.cudnn as cudnn", "from torch import load", "from torch import nn, optim",
]


@st.composite
def programs(draw):
    lines = list(draw(st.lists(st.sampled_from(IMPORTS), max_size=3)))
    indent = 0
    for _ in range(draw(st.integers(1, 25))):
        fill = {"n": draw(st.sampled_from(NAMES)), "e": draw(st.sampled_from(EXPRS))}
        if draw(st.booleans()) and indent < 6:
            header = draw(st.sampled_from(HEADERS)).format(**fill)
            for part in header.split("\n"):
                lines.append("    " * indent + part)
                if part.rstrip().endswith(":"):
                    indent += 1
            body = draw(st.sampled_from(STATEMENTS)).format(**fill)
            lines.append("    " * indent + body)
            if header.startswith("try"):
                indent -= 1
                lines.append("    " * indent + "except Exception:")
                lines.append("    " * (indent + 1) + "pass")
        else:
            lines.append("    " * indent + draw(st.sampled_from(STATEMENTS)).format(**fill))
        if indent and draw(st.integers(0, 3)) == 0:
            indent -= draw(st.integers(1, indent))
    return "\n".join(lines) + "\n"


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_generated_programs_do_not_crash_and_are_deterministic(source):
    first = check_source(source)
    second = check_source(source)
    assert [(f.line, f.column, f.code, f.message) for f in first] == [
        (f.line, f.column, f.code, f.message) for f in second
    ]
    try:
        ast.parse(source)
    except SyntaxError:
        assert [f.code for f in first] == ["TW900"]
    else:
        assert "TW900" not in {f.code for f in first}


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_never_crashes(text):
    findings = check_source(text)
    assert findings == check_source(text)
    assert all(f.line >= 1 and f.column >= 1 for f in findings)
