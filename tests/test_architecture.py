"""The package's import graph has no cycles (docs/architecture.md, "Import rules").

Every module under src/trainwise is parsed with ``ast`` (nothing is imported) and its imports of other trainwise
modules become edges: ``import trainwise.a.b``, ``from trainwise.a import b`` (to ``trainwise.a.b`` when ``b``
is a submodule, else to ``trainwise.a``) and relative imports alike. Imports under ``if TYPE_CHECKING:`` never
run, so they never count.

Two graphs are checked. The import-time graph (module level, class bodies included, function bodies left out)
must have no cycle: a module must not depend on being half-initialised. The run-time graph adds the imports
deferred into functions: a cycle there is the same design knot, only hidden; one that is the honest design
goes into ``DEFERRED_CYCLES_ALLOWED`` with its reason.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# frozenset of module names -> why that cycle through a deferred import is the right design. Empty: none is.
DEFERRED_CYCLES_ALLOWED: dict[frozenset[str], str] = {}


def module_files(src: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``package`` under ``src``."""
    out = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.Module, *, deferred: bool) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that run: at module level and in class bodies (and, with ``deferred``, inside
    functions), never those under ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                if deferred:
                    visit(child)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]))
            else:
                visit(child)

    visit(tree)
    return found


def import_graph(src: Path, package: str, *, deferred: bool) -> dict[str, dict[str, int]]:
    """module -> {imported module of the package: line of the first such import}."""
    modules = module_files(src, package)
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges: dict[str, int] = {}
        is_package = path.name == "__init__.py"
        for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path)), deferred=deferred):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    parts = name.split(".") if is_package else name.split(".")[:-1]
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                else:
                    base = node.module or ""
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            for target in targets:
                if target in modules and target != name:
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (a path back to its start) per strongly connected component of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan; the package is far too small for the recursion to matter
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    out = []
    for component in components:
        start = min(component)
        paths = {start: [start]}
        queue = [start]
        while queue:  # breadth first: the shortest way back to the start inside the component
            v = queue.pop(0)
            for w in sorted(graph[v]):
                if w == start:
                    out.append([*paths[v], start])
                    queue = []
                    break
                if w in component and w not in paths:
                    paths[w] = [*paths[v], w]
                    queue.append(w)
    return sorted(out)


def describe(cycle: list[str], graph: dict[str, dict[str, int]], src: Path) -> str:
    steps = []
    for a, b in itertools.pairwise(cycle):
        path = module_files(src, a.split(".")[0])[a].relative_to(src)
        steps.append(f"  {a} imports {b} ({path}:{graph[a][b]})")
    return " -> ".join(cycle) + "\n" + "\n".join(steps)


def test_no_import_cycles_at_import_time():
    graph = import_graph(SRC, "trainwise", deferred=False)
    found = cycles(graph)
    assert not found, "import cycles (module level):\n" + "\n".join(describe(c, graph, SRC) for c in found)


def test_no_import_cycles_through_deferred_imports():
    graph = import_graph(SRC, "trainwise", deferred=True)
    found = [c for c in cycles(graph) if frozenset(c) not in DEFERRED_CYCLES_ALLOWED]
    assert not found, ("import cycles through imports deferred into functions (move the shared piece to a module "
                       "both import, or list the cycle in DEFERRED_CYCLES_ALLOWED with its reason):\n"
                       + "\n".join(describe(c, graph, SRC) for c in found))


def test_the_graph_builder_sees_cycles_and_only_the_imports_that_run(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from pkg._version import v\n",
        "_version.py": "v = 1\n",
        "a.py": "from . import b\n",  # relative, names a submodule
        "b.py": "import pkg.sub.c as c\n",
        "sub/__init__.py": "",
        "sub/c.py": ("from typing import TYPE_CHECKING\nfrom ..a import x\n"
                     "if TYPE_CHECKING:\n    from pkg import d\nelse:\n    from pkg import _version\n"),
        "d.py": "def f():\n    from pkg.sub import c\nclass K:\n    from pkg import _version\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    now = import_graph(tmp_path, "pkg", deferred=False)
    assert {k: set(v) for k, v in now.items()} == {
        "pkg": {"pkg._version"}, "pkg._version": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.sub.c"},
        "pkg.sub": set(), "pkg.sub.c": {"pkg.a", "pkg._version"}, "pkg.d": {"pkg._version"}}
    assert cycles(now) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]]
    assert cycles(import_graph(tmp_path, "pkg", deferred=True)) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]]
    (pkg / "sub" / "c.py").write_text("from pkg import d\n")
    assert cycles(import_graph(tmp_path, "pkg", deferred=False)) == []
    assert cycles(import_graph(tmp_path, "pkg", deferred=True)) == [["pkg.d", "pkg.sub.c", "pkg.d"]]


def test_no_module_imports_the_package_init_at_import_time():
    graph = import_graph(SRC, "trainwise", deferred=False)
    assert sorted(m for m, edges in graph.items() if "trainwise" in edges) == []


def test_the_version_comes_from_version_py():
    takers = []
    for name, path in module_files(SRC, "trainwise").items():
        for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8")), deferred=True):
            if isinstance(node, ast.ImportFrom) and any(a.name == "__version__" for a in node.names) and not (
                    node.module == "trainwise._version" or (node.level == 1 and node.module == "_version")):
                takers.append(f"{name}:{node.lineno}")
    assert takers == [], "take __version__ from trainwise._version, not the package"


# The layers of docs/architecture.md, top to bottom; a module is in the layer of its first name under trainwise.
LAYERS = (
    {"cli", "__main__"},  # `python -m trainwise` is the command line
    {"labs", "demo"},
    {"trainer"},
    {"run"},
    {"policies", "strategy"},
    {"integrations"},
    {"guards"},
    set(),  # every other module: the primitives
    {"files"},
    {"errors", "_version"},
)
# Edges that go up on purpose: (importer's top name, imported top name) -> why.
UPWARD_ALLOWED = {
    ("optimizers", "guards"): "build_optimizer runs guards/loss.py's optimizer-coverage check (no hooks)",
    ("guards", "labs"): "a guard finding names the lab of its code, read from the labs catalogue (names only)",
}


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else "__init__"
    return next((i for i, names in enumerate(LAYERS) if top in names), LAYERS.index(set()))


def test_each_layer_imports_only_the_layers_below_it():
    graph = import_graph(SRC, "trainwise", deferred=True)
    upward = []
    for module, edges in graph.items():
        if module == "trainwise" or module.startswith("trainwise.doctor"):
            continue
        for target, line in edges.items():
            pair = (module.split(".")[1], target.split(".")[1] if "." in target else "__init__")
            if _layer(target) < _layer(module) and pair not in UPWARD_ALLOWED:
                upward.append(f"{module}:{line} imports {target}")
    assert upward == [], "imports that go up a layer (docs/architecture.md):\n" + "\n".join(sorted(upward))


def test_the_doctor_imports_nothing_of_trainwise_but_errors_version_and_files():
    graph = import_graph(SRC, "trainwise", deferred=True)
    outside = sorted(f"{module} imports {target}" for module, edges in graph.items()
                     if module.startswith("trainwise.doctor") for target in edges
                     if not target.startswith("trainwise.doctor")
                     and target not in ("trainwise.errors", "trainwise._version", "trainwise.files"))
    assert outside == []
