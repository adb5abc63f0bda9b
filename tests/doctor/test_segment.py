"""Context.segment is ast.get_source_segment without re-splitting the file on every call."""

from __future__ import annotations

import ast
from pathlib import Path

from trainwise.doctor.context import Context

SOURCES = [
    "x = 1\n",
    "a = (1,\n     2)\r\nb = 'é' + \"ü\"  # comment\rc = [\n  x\n  for x in y]\n",
    "def f(a, b=3):\n    return {'k': a +\n            b}\n\nclass C:\n    z: int = 0\n",
    "s = '''multi\nline\n  string'''\nt = f'{s!r:>10}'\n",
    "x = 1",  # no final newline
]


def test_segment_matches_ast_on_every_node():
    files = [*SOURCES, (Path(__file__).parents[2] / "src/trainwise/doctor/rule.py").read_text()]
    for source in files:
        tree = ast.parse(source)
        context = Context(tree, source)
        for node in ast.walk(tree):
            assert context.segment(node) == (ast.get_source_segment(source, node) or ""), ast.dump(node)[:80]


def test_the_file_is_split_once_not_per_call():
    """ast.get_source_segment splits the whole file on every call: a 12,000-line file with 4,000 findings
    took minutes. The context splits it once."""
    source = "".join(f"total_{i} = value_{i} + {i}\n" for i in range(2000))
    context = Context(ast.parse(source), source)
    names = [n for n in ast.walk(context.tree) if isinstance(n, ast.Name)]
    context.segment(names[0])
    lines = context._source_lines
    for node in names:
        assert context.segment(node) == node.id
    assert context._source_lines is lines and len(lines) == 2000
