"""Every name trainwise writes in a run folder is spelled in one module, ``trainwise/run_folder.py``.

Every other module under src/trainwise is parsed with ``ast`` and its string constants (f-string pieces too,
docstrings and sentences with spaces left out: prose may name a file) are checked for a run-folder name used as
a path: the whole string, or one of its ``/`` parts, is a name of :data:`NAMES`, or holds a checkpoint's or
sharded folder's name stem.
"""

from __future__ import annotations

import ast
from pathlib import Path

from trainwise import run_folder

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "trainwise"
OWNER = PACKAGE / "run_folder.py"

NAMES = {value for key, value in vars(run_folder).items()
         if key.isupper() and isinstance(value, str) and key != "RUN_ID_KEY"}  # a key in a record, not a file
STEMS = (run_folder.checkpoint_name(0).split("0")[0], run_folder.sharded_name(0).split("0")[0])

# (file under src/trainwise, literal) -> why the literal is not a run-folder name there.
ALLOWED = {
    ("tracking.py", "tensorboard"): "the logger's name in loggers=[...] and its package's, which the folder shares",
}


def _docstrings(tree: ast.Module) -> set[int]:
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, nodes) and node.body and isinstance(node.body[0], ast.Expr)}


def is_run_folder_path(text: str) -> bool:
    """Whether ``text`` spells a run-folder name as (part of) a path."""
    if not text or any(ch.isspace() for ch in text):
        return False
    parts = text.replace("\\", "/").split("/")
    return any(part in NAMES or any(stem in part for stem in STEMS) for part in parts)


def spelled(path: Path) -> list[tuple[int, str]]:
    """(line, literal) for every run-folder name spelled in the module at ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _docstrings(tree)
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
            and is_run_folder_path(node.value)]


def test_the_scan_sees_the_names_where_they_are_defined():
    found = {literal for _, literal in spelled(OWNER)}
    assert found >= NAMES, NAMES - found
    assert {"checkpoints", "metrics.jsonl", "config.json", ".trainwise.lock", "manifest.json"} <= NAMES
    assert all(any(stem in literal for literal in found) for stem in STEMS), STEMS


def test_the_scan_catches_a_name_built_into_a_path():
    source = 'def where(run_dir):\n    return f"{run_dir}/metrics.jsonl", run_dir / "checkpoints" / "ckpt-step1.pt"\n'
    literals = [node.value for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.Constant) and isinstance(node.value, str)]
    assert {text for text in literals if is_run_folder_path(text)} == {"/metrics.jsonl", "checkpoints", "ckpt-step1.pt"}
    assert not is_run_folder_path("metrics.jsonl keeps every record.")  # a sentence may name the file


def test_no_module_but_run_folder_spells_a_run_folder_name():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == OWNER:
            continue
        where = path.relative_to(PACKAGE).as_posix()
        for line, literal in spelled(path):
            if (where, literal) not in ALLOWED:
                found.append(f"{where}:{line}: {literal!r}")
    assert not found, "import these names from trainwise.run_folder instead:\n" + "\n".join(found)
