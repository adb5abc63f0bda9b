"""What keeps the doctor linear in the size of what it checks: the indexed lookups give the answers the plain
scans gave, and inputs past the size limit are skipped with one TW900 line (benchmarks/doctor_scaling.py times
the growth itself; no timed assertion here)."""

from __future__ import annotations

import ast
import json

import pytest

import trainwise.doctor.analysis as analysis
from trainwise.doctor.context import Context, position
from trainwise.doctor.context import index as index_module
from trainwise.doctor.engine import check_paths

# One training run, repeated at module level: the same names bound again and again (`+=` included), the shape
# of a notebook whose cells were run in turn.
RUN = """\
net = Classifier()
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for batch, target in batches:
    opt.zero_grad()
    out = net(batch)
    out = out.float()
    cost = criterion(out, target)
    cost.backward()
    opt.step()
hits = 0
with torch.no_grad():
    for batch, target in held_out:
        hits += (net(batch).argmax(1) == target).sum().item()
        hits = hits + 0
print(hits / len(held_out.dataset))
"""


def _scanned_reaching(ctx: Context, node: ast.AST, at: ast.AST) -> list:
    """``FileIndex.reaching`` as a scan of every binding (what it did before the source-order index)."""
    found = [b for b in ctx.bindings_of(node, at) if b.kind != "del"]
    if not found:
        return []
    before = [b for b in found if position(b.stmt) < position(at) and not ctx.is_inside(at, b.stmt)]
    if not before:
        return found
    last = max(before, key=lambda b: position(b.stmt))
    if last.kind == "augassign":
        return [b for b in before if b.kind != "augassign"][-1:] or [last]
    return [last]


def _scanned_last_before(ctx: Context, node: ast.AST, at: ast.AST) -> list:
    found = [b for b in ctx.bindings_of(node, at) if b.kind != "del"]
    before = [b for b in found if position(b.stmt) < position(at)]
    return [max(before, key=lambda b: position(b.stmt))] if before else found


def test_indexed_bindings_answer_as_the_scan_did(monkeypatch):
    monkeypatch.setattr(index_module, "_ORDERED_FROM", 0)  # every list through the index
    source = "import torch\n" + RUN * 30 + "del hits\nhits = 1\n"
    ctx = Context(ast.parse(source), source, "train.py")
    checked = 0
    for node in ctx.nodes(ast.Name):
        for at in (node, ctx.parent(node)):
            assert [id(b) for b in ctx.reaching(node, at)] == [id(b) for b in _scanned_reaching(ctx, node, at)]
            assert [id(b) for b in ctx.last_bound_before(node, at)] == [
                id(b) for b in _scanned_last_before(ctx, node, at)]
            checked += 1
    assert checked > 1000


def test_deep_chain_scopes_answer_as_the_walk_did():
    source = "def f(model):\n    return model" + ".to(device)" * 400 + "\n"
    ctx = Context(ast.parse(source), source, "deep.py")
    function = ctx.tree.body[0]
    names = ctx.nodes(ast.Name)
    assert {id(ctx.scope(n)) for n in names} == {id(function)}
    assert ctx.scope(function) is ctx.tree


@pytest.fixture
def small_limit(monkeypatch):
    monkeypatch.setattr(analysis, "MAX_SOURCE", 2_000)
    monkeypatch.setattr("trainwise.doctor.program.MAX_SOURCE", 2_000)


def _notebook(cells: list[str]) -> str:
    return json.dumps({"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "source": c} for c in cells],
                       "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def test_files_past_the_limit_get_one_line_and_the_run_goes_on(tmp_path, small_limit):
    (tmp_path / "huge.py").write_text("import torch\n" + "state = torch.load('a.pt')\n" * 200)
    (tmp_path / "huge.ipynb").write_text(_notebook(["import torch\n"] + ["x = torch.load('a.pt')\n"] * 200))
    (tmp_path / "train.py").write_text("import torch\nfrom huge import state\nsd = torch.load('b.pt')\n")
    results = {r.path.rsplit("/", 1)[-1]: r for r in check_paths([str(tmp_path)])}
    for name in ("huge.py", "huge.ipynb"):
        findings = results[name].findings
        assert [f.code for f in findings] == ["TW900"], findings
        assert findings[0].message.startswith("skipped:") and "characters of code" in findings[0].message
        assert not results[name].parsed
    assert [f.code for f in results["train.py"].findings] == ["TW301"]
