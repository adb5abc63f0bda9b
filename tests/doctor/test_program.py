"""The program a run checks (``trainwise.doctor.program``): imports resolved to the other files of the run,
calls followed across files and back, constants through imports, a memory budget that never changes an
answer, and findings across files named in every output format."""

from __future__ import annotations

import ast
import io
import json
import textwrap
from pathlib import Path

import pytest

from trainwise.doctor.engine import check_file, check_paths, check_sources, read_source
from trainwise.doctor.program import Program, Symbol
from trainwise.doctor.report import render

UTILS = """\
import torch


def seed_everything(seed):
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = True
"""
TRAIN = """\
import torch

from utils import seed_everything

seed_everything(0)
torch.backends.cudnn.benchmark = True
"""


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


def program_of(root: Path) -> Program:
    return Program(sorted(str(p) for p in root.rglob("*.py")), read_source)


def resolved(program: Program, root: Path, path: str, expression: str) -> Symbol | None:
    ctx = program.context(str(root / path))
    assert ctx is not None
    node = next(n for n in ast.walk(ctx.tree) if isinstance(n, (ast.Name, ast.Attribute))
                and ast.unparse(n) == expression)
    found = program.resolve(ctx, node)
    return None if found is None else Symbol(Path(found.path).relative_to(root).as_posix(), found.name)


@pytest.mark.parametrize(
    ("importer", "expression", "expected"),
    [
        ("from utils.utils_fit import fit_one_epoch\nfit_one_epoch()\n", "fit_one_epoch",
         Symbol("utils/utils_fit.py", "fit_one_epoch")),
        ("import utils.utils_fit as U\nU.fit_one_epoch()\n", "U.fit_one_epoch",
         Symbol("utils/utils_fit.py", "fit_one_epoch")),
        ("import utils.utils_fit\nutils.utils_fit.fit_one_epoch()\n", "utils.utils_fit.fit_one_epoch",
         Symbol("utils/utils_fit.py", "fit_one_epoch")),
        ("from utils import utils_fit\nutils_fit.fit_one_epoch()\n", "utils_fit.fit_one_epoch",
         Symbol("utils/utils_fit.py", "fit_one_epoch")),
        ("from nets import YoloBody\nYoloBody()\n", "YoloBody", Symbol("nets/yolo.py", "YoloBody")),
        ("from nets.yolo import YoloBody as Y\nY()\n", "Y", Symbol("nets/yolo.py", "YoloBody")),
        ("import nets\nnets.YoloBody()\n", "nets.YoloBody", Symbol("nets/yolo.py", "YoloBody")),
        ("from nets.yolo import YoloBody\nYoloBody.forward\n", "YoloBody.forward",
         Symbol("nets/yolo.py", "YoloBody.forward")),
        ("import torch\ntorch.load\n", "torch.load", None),  # a library: not in the run
        ("from utils.utils_fit import missing\nmissing()\n", "missing", None),
        ("from utils.utils_fit import fit_one_epoch\nfit_one_epoch = None\nfit_one_epoch\n", "fit_one_epoch", None),
    ],
)
def test_imports_resolve_to_the_files_of_the_run(tmp_path, importer, expression, expected):
    write(tmp_path, {
        "utils/utils_fit.py": "def fit_one_epoch():\n    pass\n",  # a namespace package: no __init__.py
        "nets/__init__.py": "from .yolo import YoloBody\n",
        "nets/yolo.py": "class YoloBody:\n    def forward(self):\n        pass\n",
        "train.py": importer,
    })
    assert resolved(program_of(tmp_path), tmp_path, "train.py", expression) == expected


def test_relative_imports_start_from_the_package(tmp_path):
    write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/common/__init__.py": "",
        "pkg/common/seeding.py": "def seed():\n    pass\n",
        "pkg/tools/__init__.py": "",
        "pkg/tools/run.py": "from ..common.seeding import seed\nfrom . import helpers\nseed()\nhelpers.go()\n",
        "pkg/tools/helpers.py": "def go():\n    pass\n",
        "seeding.py": "def seed():\n    pass\n",  # same name at the top: not what the relative import means
    })
    program = program_of(tmp_path)
    assert resolved(program, tmp_path, "pkg/tools/run.py", "seed") == Symbol("pkg/common/seeding.py", "seed")
    assert resolved(program, tmp_path, "pkg/tools/run.py", "helpers.go") == Symbol("pkg/tools/helpers.py", "go")



def test_star_imports_resolve_to_the_module_that_defines_the_name(tmp_path):
    """``from .base import *`` in a package's ``__init__.py`` and ``from utils import *`` in a script: a name
    resolves to the file that defines it (the last star import that has it, as in Python); a name no star
    module defines, a local name and a builtin resolve to nothing."""
    write(tmp_path, {
        "models/__init__.py": "from .base import *\nfrom .heads import *\n",
        "models/base.py": "class Base:\n    pass\n\n\ndef shared():\n    pass\n",
        "models/heads.py": "def shared():\n    pass\n",
        "utils/__init__.py": "",
        "utils/fit.py": "def fit_one_epoch():\n    pass\n",
        "train.py": "from models import Base\nfrom utils.fit import *\nfrom models import *\n\n"
                    "fit_one_epoch()\nshared()\nprint(Base)\n\n\ndef local():\n    fit_one_epoch = 1\n"
                    "    return fit_one_epoch\n",
    })
    program = program_of(tmp_path)
    assert resolved(program, tmp_path, "train.py", "Base") == Symbol("models/base.py", "Base")
    assert resolved(program, tmp_path, "train.py", "fit_one_epoch") == Symbol("utils/fit.py", "fit_one_epoch")
    assert resolved(program, tmp_path, "train.py", "shared") == Symbol("models/heads.py", "shared")
    assert resolved(program, tmp_path, "train.py", "print") is None
    ctx = program.context(str(tmp_path / "train.py"))
    assert ctx is not None
    inner = [n for n in ast.walk(ctx.tree) if isinstance(n, ast.Name) and n.id == "fit_one_epoch"][-1]
    assert program.resolve(ctx, inner) is None  # the function's own variable

def test_callers_across_files_and_constants_through_imports(tmp_path):
    write(tmp_path, {
        "config.py": "CKPT = 'weights/best.pth'\nSIZE = 3\nSIZE = 4\n",
        "engine.py": "def evaluate(model, loader):\n    return [model(x) for x in loader]\n",
        "train.py": "from engine import evaluate\nfrom config import CKPT, SIZE\nevaluate(1, [])\nprint(CKPT, SIZE)\n",
        "test.py": "import engine\nengine.evaluate(2, [])\n",
    })
    program = program_of(tmp_path)
    engine = program.context(str(tmp_path / "engine.py"))
    assert engine is not None
    fn = engine.tree.body[0]
    sites = sorted((Path(ctx.path).name, call.lineno) for ctx, call in program.callers(engine, fn))
    assert sites == [("test.py", 2), ("train.py", 3)]
    train = program.context(str(tmp_path / "train.py"))
    assert train is not None
    names = {n.id: n for n in ast.walk(train.tree) if isinstance(n, ast.Name)}
    assert program.constant(train, names["CKPT"]) == "weights/best.pth"
    assert program.constant(train, names["SIZE"]) is ...  # bound twice: not a constant


def test_a_small_budget_parses_again_and_answers_the_same(tmp_path):
    files = {f"m{i}.py": f"def f{i}():\n    pass\n" for i in range(20)}
    files["main.py"] = "".join(f"from m{i} import f{i}\n" for i in range(20)) + "".join(f"f{i}()\n" for i in range(20))
    write(tmp_path, files)
    roomy, tight = program_of(tmp_path), program_of(tmp_path)
    tight._budget = 1  # one file kept at a time
    for program in (roomy, tight):
        main = program.context(str(tmp_path / "main.py"))
        assert main is not None
        calls = [n for n in ast.walk(main.tree) if isinstance(n, ast.Call)]
        found = [program.callee(main, c) for c in calls]
        assert [fn.name for _, fn in found] == [f"f{i}" for i in range(20)]  # type: ignore[misc]
    assert len(tight._contexts) == 1 and len(roomy._contexts) == 21


def test_a_file_checked_alone_has_no_finding_across_files(tmp_path):
    write(tmp_path, {"utils.py": UTILS, "train.py": TRAIN})
    assert [f.code for r in check_paths([str(tmp_path)]) for f in r.findings] == ["TW202"]
    assert check_file(str(tmp_path / "train.py")).findings == []


def test_unreadable_and_broken_files_answer_nothing(tmp_path):
    write(tmp_path, {"utils.py": "def seed_everything(:\n", "train.py": TRAIN})
    results = {Path(r.path).name: [f.code for f in r.findings] for r in check_paths([str(tmp_path)])}
    assert results == {"train.py": [], "utils.py": ["TW900"]}
    assert read_source(str(tmp_path / "missing.py")) is None


def test_findings_across_files_name_both_places_in_every_format(tmp_path):
    found = check_sources({"utils.py": UTILS, "train.py": TRAIN})
    assert found["utils.py"] == []
    (finding,) = found["train.py"]
    assert "utils.py:6" in finding.message
    (related,) = finding.related
    assert (related.path, related.line, related.column) == ("utils.py", 6, 5)

    text = io.StringIO()
    render([finding], text, fmt="text", files=2)
    lines = text.getvalue().splitlines()
    assert lines[0].startswith("train.py:6:1: TW202 ") and lines[1].startswith("  utils.py:6:5: note: ")

    out = io.StringIO()
    render([finding], out, fmt="json")
    (data,) = json.loads(out.getvalue())
    assert data["related"] == [{"path": "utils.py", "line": 6, "column": 5, "message": related.message}]

    out = io.StringIO()
    render([finding], out, fmt="sarif")
    (result,) = json.loads(out.getvalue())["runs"][0]["results"]
    (location,) = result["relatedLocations"]
    assert location["physicalLocation"]["artifactLocation"]["uri"] == "utils.py"
    assert location["physicalLocation"]["region"] == {"startLine": 6, "startColumn": 5}

    out = io.StringIO()
    render([finding], out, fmt="github")
    assert out.getvalue().count("::error ") == 1 and "%0Autils.py:6:5: note: " in out.getvalue()


def test_a_finding_without_related_places_keeps_its_json_keys():
    found = check_sources({"train.py": "import torch\nstate = torch.load('x.pt')\n"})
    assert set(found["train.py"][0].to_dict()) == {"path", "line", "column", "code", "name", "message", "fixable"}


def test_a_notebook_calls_a_helper_of_the_run(tmp_path):
    cells = [{"cell_type": "markdown", "metadata": {}, "source": ["# notes"]},
             {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
              "source": ["import torch\n", "from utils import seed_everything\n"]},
             {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
              "source": ["seed_everything(1)\n", "torch.backends.cudnn.benchmark = True\n"]}]
    notebook = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "explore.ipynb").write_text(json.dumps(notebook), encoding="utf-8")
    write(tmp_path, {"utils.py": UTILS})
    (finding,) = [f for r in check_paths([str(tmp_path)]) for f in r.findings]
    assert (Path(finding.path).name, finding.cell, finding.line) == ("explore.ipynb", 3, 2)
    assert [(Path(r.path).name, r.line) for r in finding.related] == [("utils.py", 6)]


def test_a_helper_called_from_a_notebook_names_the_cell(tmp_path):
    cells = [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
              "source": ["import torch\n", "from engine import evaluate\n"]},
             {"cell_type": "markdown", "metadata": {}, "source": ["## validation"]},
             {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
              "source": ["model = torch.nn.Linear(2, 2)\n", "print(evaluate(model, val_loader))\n"]}]
    notebook = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "explore.ipynb").write_text(json.dumps(notebook), encoding="utf-8")
    write(tmp_path, {"engine.py": """\
        import torch


        def evaluate(model, loader):
            model.eval()
            return sum(model(x).sum().item() for x in loader)
        """})
    (finding,) = [f for r in check_paths([str(tmp_path)]) for f in r.findings]
    assert (finding.code, Path(finding.path).name, finding.line) == ("TW104", "engine.py", 6)
    assert [(Path(r.path).name, r.cell, r.line) for r in finding.related] == [("explore.ipynb", 3, 2)]
    assert "explore.ipynb:cell 3:2" in finding.message


def test_import_cycles_and_odd_imports_end(tmp_path):
    """Cycles (a package whose ``__init__`` imports a name from itself, two modules importing each other),
    relative imports above the run's top folder, star imports: every question ends, nothing raises."""
    write(tmp_path, {
        "loop/__init__.py": "from loop import thing\nfrom .loop import other\n",
        "loop/loop.py": "from . import other\nfrom loop import thing\n",
        "a.py": "from b import f\n\ndef g():\n    f()\n",
        "b.py": "from a import g as f\n\ndef h():\n    f()\n",
        "deep.py": "from .......far import away\nfrom . import *\naway()\n",
        "train.py": """\
            import torch
            from loop import thing, other
            from a import g
            import b

            torch.backends.cudnn.benchmark = True
            thing()
            other()
            g()
            b.h()
            b.f()
            """,
    })
    findings = [f for r in check_paths([str(tmp_path)]) for f in r.findings]
    assert findings == []
    program = program_of(tmp_path)
    train = program.context(str(tmp_path / "train.py"))
    assert train is not None
    calls = [n for n in ast.walk(train.tree) if isinstance(n, ast.Call)]
    assert all(program.callee(train, c) is None or c.func is not None for c in calls)


def test_the_class_a_name_holds_and_whether_its_layers_depend_on_the_mode(tmp_path):
    """``class_of_value`` finds the class of ``net = Generator()`` in another file of the run, and
    ``mode_free_class`` tells a generator of convolutions and InstanceNorm (the same in both modes) from one
    with dropout, one built around a library backbone, and one whose block (in a third file) holds BatchNorm."""
    from trainwise.doctor.context.modules import mode_free_class

    write(tmp_path, {
        "blocks.py": "import torch.nn as nn\n\n\nclass Block(nn.Module):\n    def __init__(self, d):\n"
                     "        super().__init__()\n        self.bn = nn.BatchNorm2d(d)\n",
        "models.py": "import torch.nn as nn\nimport torchvision\nfrom blocks import Block\n\n\n"
                     "class Generator(nn.Module):\n    def __init__(self, d=8):\n        super().__init__()\n"
                     "        layers = [nn.Conv2d(3, d, 3), nn.InstanceNorm2d(d, track_running_stats=True)]\n"
                     "        layers.append(nn.ReLU(inplace=True))\n        self.main = nn.Sequential(*layers)\n\n\n"
                     "class Dropping(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                     "        self.main = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5))\n\n\n"
                     "class Wrapped(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                     "        self.backbone = torchvision.models.resnet18()\n\n\n"
                     "class WithBlock(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                     "        self.block = Block(4)\n",
        "test.py": "from models import Dropping, Generator, WithBlock, Wrapped\n\n"
                   "g = Generator()\nd = Dropping()\nw = Wrapped()\nb = WithBlock()\nprint(g, d, w, b)\n",
    })
    program = program_of(tmp_path)
    test = program.context(str(tmp_path / "test.py"))
    assert test is not None
    at = test.tree.body[-1]
    found = {name: test.class_of_value(name, at) for name in ("g", "d", "w", "b")}
    assert {name: cls.name for name, (_ctx, cls) in found.items()} == {
        "g": "Generator", "d": "Dropping", "w": "Wrapped", "b": "WithBlock"}
    assert {name: mode_free_class(ctx, cls) for name, (ctx, cls) in found.items()} == {
        "g": True, "d": False, "w": False, "b": False}
    assert test.class_of_value("print", at) is None


@pytest.mark.parametrize(("code", "restores"), [
    ("was_training = model.training\nmodel.eval()\nmodel.train(was_training)\n", True),
    ("was_training = model.training\nmodel.eval()\nif was_training:\n    model.train()\n", True),
    ("model.eval()\nmodel.train(model.training)\n", True),
    ("model.eval()\nmodel.train()\n", False),
    ("flag = True\nmodel.eval()\nif flag:\n    model.train()\n", False),
    ("was_training = model.training\nmodel.eval()\nif was_training:\n    pass\nelse:\n    model.train()\n", False),
])
def test_a_train_call_that_restores_a_saved_mode(code, restores):
    from trainwise.doctor.context import Context

    ctx = Context(ast.parse(code), code)
    train = [n for n in ast.walk(ctx.tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "train"]
    assert [ctx.restores_mode(call) for call in train] == [restores]


def test_a_question_about_another_file_is_answered_once_for_the_run(tmp_path):
    """Ten model files derive from the module class of one file, and call a helper of another that trains
    nothing: with one file kept at a time, each of those files is still read once, not once per question
    (transformers' model files all derive from ``PreTrainedModel``: a run took half as long again)."""
    from collections import Counter

    from trainwise.doctor.analysis import analyse
    from trainwise.doctor.engine import Config

    files = {
        "base.py": "from torch import nn\n\n\nclass Base(nn.Module):\n    pass\n",
        "helpers.py": "def report(model):\n    print(model)\n",
    }
    for i in range(10):
        files[f"net{i}.py"] = (
            "from torch import nn\nfrom base import Base\nfrom helpers import report\n\n\n"
            f"class Net{i}(Base):\n    def __init__(self):\n        super().__init__()\n"
            "        self.backbone = nn.BatchNorm2d(3)\n        self.layers = [nn.Linear(2, 2)]\n\n\n"
            f"model = Net{i}()\nmodel.backbone.requires_grad_(False)\nreport(model)\n")
    write(tmp_path, files)
    reads: Counter[str] = Counter()

    def reader(path: str):  # type: ignore[no-untyped-def]
        reads[Path(path).name] += 1
        return read_source(path)

    paths = sorted(str(p) for p in tmp_path.glob("net*.py"))
    program = Program([str(tmp_path / "base.py"), str(tmp_path / "helpers.py"), *paths], reader, budget=1)
    codes = []
    for path in paths:
        text = read_source(path)
        assert text is not None
        findings, _ = analyse(text.text, path, rules=Config().rules(), program=program)
        codes += [f.code for f in findings]
    assert codes == ["TW114"] * 10  # the lists of layers, found through the base class of another file
    assert reads["base.py"] == 1 and reads["helpers.py"] == 1, reads


def test_a_run_keeps_the_text_of_the_files_it_may_fix(tmp_path):
    write(tmp_path, {"load.py": "import torch\n\nstate = torch.load('w.pt')\n", "clean.py": "x = 1\n",
                     "broken.py": "def f(:\n"})
    results = {Path(r.path).name: r for r in check_paths([str(tmp_path)])}
    assert results["load.py"].source is not None and results["load.py"].findings[0].fix is not None
    assert results["clean.py"].source is None and results["clean.py"].parsed  # nothing to fix: text dropped
    assert results["broken.py"].source == "def f(:\n"  # a TW900 keeps its text (it is never rewritten)


def test_what_builds_a_value_through_factories_and_registries(tmp_path):
    """``values.built_by`` follows a name to the class that builds its object: through a dict registry of
    another file subscripted with a constant key, a factory function's ``return``, two assignments that agree,
    and a moved module (``.to()``); assignments that disagree, a parameter and an unknown key are unknown."""
    from trainwise.doctor.context.values import built_by

    write(tmp_path, {
        "zoo/__init__.py": "from .nets import make_small, Large\n\nREGISTRY = {'small': make_small, 'large': Large}\n",
        "zoo/nets.py": "import torch.nn as nn\n\n\nclass Small(nn.Module):\n    pass\n\n\nclass Large(nn.Module):\n"
                       "    pass\n\n\ndef make_small(width=4):\n    net = Small()\n    return net\n",
        "train.py": "import torchvision\nfrom zoo import REGISTRY\n\nkey = 'small'\nif key:\n"
                    "    a = REGISTRY[key](width=8)\nelse:\n    a = REGISTRY[key]()\n"
                    "b = REGISTRY['large']().to('cpu')\n"
                    "c = REGISTRY['small']() if key else REGISTRY['large']()\n"
                    "if key:\n    d = REGISTRY['small']()\nelse:\n    d = REGISTRY['large']()\n"
                    "e = REGISTRY['missing']()\nf = torchvision.models.resnet18()\n\n\n"
                    "def g(model):\n    return model\n",
    })
    program = program_of(tmp_path)
    ctx = program.context(str(tmp_path / "train.py"))
    assert ctx is not None
    at = ctx.tree.body[-1]

    def built(name: str, where: ast.AST = at) -> str | None:
        found = built_by(ctx, ast.Name(id=name, ctx=ast.Load()), where)
        if found is None:
            return None
        return found.cls.name if found.cls is not None else ast.unparse(found.node)

    assert built("a") == "Small"
    assert built("b") == "Large"
    assert built("f") == "torchvision.models.resnet18()"
    assert [built(n) for n in ("c", "d", "e")] == [None, None, None]
    assert built("model", at.body[0]) is None  # type: ignore[attr-defined]
