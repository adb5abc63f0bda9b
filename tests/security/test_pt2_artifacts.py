"""Untrusted ``.pt2`` artifacts: a tampered archive never runs code in ``load_exported`` or ``trainwise predict``.

``torch.export.load`` unpickles some archive entries with ``weights_only=False`` (weights or constants marked
``use_pickle``, "opaque" constants, the legacy state-dict layouts, sample inputs that fail the weights-only
unpickler), evaluates the graph's symbolic shape expressions with ``sympy.sympify`` (``eval``), ``exec``s the
archive's guard code in ``ExportedProgram.module()`` and calls any ``torch.*`` function a graph node names. Each
attack below is built from a real export; the first test shows that plain ``torch.export.load`` runs the payloads
(on the torch this was written against), the others that trainwise refuses every one of them with one sentence
before anything runs. The fuzz tests mutate a valid archive and its sidecar: TrainwiseError or a working model,
never another exception, never code execution.
"""

from __future__ import annotations

import contextlib
import io
import json
import operator
import pathlib
import pickle
import random
import shutil
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest
import torch
from torch import nn

import trainwise
from trainwise.cli import main
from trainwise.errors import TrainwiseError
from trainwise.exporting import load_exported


class _Touch:
    """Pickles as ``pathlib.Path(marker).touch()``: the payload's visible side effect."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


class _Stealth:
    """Pickles as ``(touch(marker), value)[1]``: the payload runs and the load still gets the real ``value``."""

    def __init__(self, marker: pathlib.Path, value) -> None:
        self.marker, self.value = marker, value

    def __reduce__(self):
        return (operator.getitem, ((_Touch(self.marker), self.value), 1))


def _torch_save(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _entries(path: pathlib.Path) -> tuple[str, dict[str, bytes]]:
    """The archive's root folder and its members by name below it (``models/model.json``...)."""
    with zipfile.ZipFile(path) as archive:
        root = archive.namelist()[0].split("/")[0]
        return root, {info.filename.split("/", 1)[1]: archive.read(info.filename) for info in archive.infolist()}


def _write(path: pathlib.Path, root: str, entries: dict[str, bytes]) -> pathlib.Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, data in entries.items():
            archive.writestr(f"{root}/{name}" if root else name, data)
    return path


def _json(entries: dict[str, bytes], name: str) -> dict:
    return json.loads(entries[name])


def _set_json(entries: dict[str, bytes], name: str, data) -> None:
    entries[name] = json.dumps(data).encode()


WEIGHTS = "data/weights/model_weights_config.json"
CONSTANTS = "data/constants/model_constants_config.json"
MODEL = "models/model.json"
SAMPLE = "data/sample_inputs/model.pt"


def _pickled_weight(entries, marker, state):
    config = _json(entries, WEIGHTS)
    fqn, meta = next(iter(config["config"].items()))
    meta["use_pickle"] = True
    _set_json(entries, WEIGHTS, config)
    entries[f"data/weights/{meta['path_name']}"] = _torch_save(_Stealth(marker, nn.Parameter(state[fqn].clone())))


def _pickled_constant(entries, marker, state):
    config = _json(entries, CONSTANTS)
    config["config"]["evil"] = {"path_name": "tensor_0", "is_param": False, "use_pickle": True, "tensor_meta": None}
    _set_json(entries, CONSTANTS, config)
    entries["data/constants/tensor_0"] = _torch_save(_Stealth(marker, torch.zeros(1)))


def _opaque_constant(entries, marker, state):
    config = _json(entries, CONSTANTS)
    config["config"]["evil"] = {"path_name": "opaque_obj_0", "is_param": False, "use_pickle": True, "tensor_meta": None}
    _set_json(entries, CONSTANTS, config)
    entries["data/constants/opaque_obj_0"] = pickle.dumps(_Touch(marker), protocol=2)


def _legacy_weights(entries, marker, state):
    entries["data/weights/model.pt"] = _torch_save(_Stealth(marker, {}))


def _sample_inputs(entries, marker, state):
    entries[SAMPLE] = _torch_save(_Stealth(marker, ((torch.zeros(2, 3),), {})))


def _guard_code(entries, marker, state):
    model = _json(entries, MODEL)
    model["guards_code"] = [f"__import__('pathlib').Path({str(marker)!r}).touch() is None"]
    _set_json(entries, MODEL, model)


def _sym_expr(entries, marker, state):
    model = _json(entries, MODEL)
    patched = []

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "expr_str" and not patched:
                    node[key] = f"__import__('pathlib').Path({str(marker)!r}).touch() or {value}"
                    patched.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(model)
    assert patched, "the base export has no symbolic shape (dynamic_batch=True should give one)"
    _set_json(entries, MODEL, model)


def _node(target: str, inputs: list[dict]):
    def edit(entries, marker, state):
        model = _json(entries, MODEL)
        node = {"target": target, "inputs": inputs, "outputs": [], "metadata": {}, "name": "evil"}
        model["graph_module"]["graph"]["nodes"].insert(0, node)
        _set_json(entries, MODEL, model)

    return edit


def _aten_save(entries, marker, state):
    args = [
        {"name": "item", "arg": {"as_tensor": {"name": "x"}}, "kind": 1},
        {"name": "filename", "arg": {"as_string": str(marker)}, "kind": 1},
    ]
    _node("torch.ops.aten.save.default", args)(entries, marker, state)


def _custom_library(entries, marker, state):
    """An operator of a library other than torch's own: this process could register anything under that name."""
    _node("torch.ops.evil_lib.touch.default", [{"name": "path", "arg": {"as_string": str(marker)}, "kind": 1}])(
        entries, marker, state
    )


def _dunder_path(entries, marker, state):
    """A name shaped like an operator whose getattr steps reach Python's special attributes instead."""
    _node("torch.ops.aten.__class__.__init__", [])(entries, marker, state)


def _python_function(entries, marker, state):
    _node("torch.os.mkdir", [{"name": "path", "arg": {"as_string": str(marker)}, "kind": 1}])(entries, marker, state)


def _native_library(entries, marker, state):
    entries["data/aotinductor/model/model.so"] = b"\x7fELF" + bytes(60)


def _code_in_a_name(entries, marker, state):
    """The input's name, which ExportedProgram.module() writes into ``def forward(self, <name>)``."""
    model = _json(entries, MODEL)
    (name,) = [spec["user_input"]["arg"]["as_tensor"]["name"] for spec in model["graph_module"]["signature"]
               ["input_specs"] if "user_input" in spec]  # fmt: skip
    evil = json.dumps(f"{name}=__import__('pathlib').Path({str(marker)!r}).touch()")
    entries[MODEL] = entries[MODEL].decode().replace(json.dumps(name), evil).encode()


def _legacy_layout(entries, marker, state):
    """The torch 2.7 layout that torch.export.load still falls back to: everything pickled."""
    entries.clear()
    entries["version"] = b"8.20"
    entries["serialized_exported_program.json"] = b"{}"
    entries["serialized_state_dict.pt"] = _torch_save(_Stealth(marker, {}))
    entries["serialized_constants.pt"] = _torch_save({})
    entries["serialized_example_inputs.pt"] = _torch_save(((), {}))


# name: (edit, fragment of the refusal, whether plain torch.export.load + one call runs the payload)
ATTACKS = {
    "pickled-weight": (_pickled_weight, "data/weights/weight_", True),
    "pickled-constant": (_pickled_constant, "tensor_0", True),
    "opaque-constant": (_opaque_constant, "opaque_obj_0", True),
    "legacy-weights": (_legacy_weights, "data/weights/model.pt", True),
    "sample-inputs": (_sample_inputs, SAMPLE, True),
    "guard-code": (_guard_code, "guards_code", True),
    "sym-expr": (_sym_expr, "expr_str", True),
    "aten-save": (_aten_save, "aten.save", False),
    "python-function": (_python_function, "torch.os.mkdir", False),
    "custom-library": (_custom_library, "the library 'evil_lib'", False),
    "dunder-path": (_dunder_path, "torch.ops.aten.__class__.__init__", False),
    "native-library": (_native_library, "data/aotinductor/", False),
    "code-in-a-name": (_code_in_a_name, MODEL, False),
    "legacy-layout": (_legacy_layout, "version", False),
}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A dynamic-batch export of a small MLP, written by trainwise.export with its sidecar."""
    folder = tmp_path_factory.mktemp("pt2-base")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    path = folder / "base.pt2"
    trainwise.export(model, torch.randn(2, 3), path)
    return path, model


def _build(base, folder: pathlib.Path, name: str) -> tuple[pathlib.Path, pathlib.Path]:
    """The attack's archive in ``folder`` (with a copy of the sidecar) and the marker its payload would touch."""
    path, model = base
    edit = ATTACKS[name][0]
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / f"{name}.marker"
    root, entries = _entries(path)
    edit(entries, marker, model.state_dict())
    target = _write(folder / f"{name}.pt2", "" if "version" in entries else root, entries)
    shutil.copyfile(path.with_name(path.name + ".json"), target.with_name(target.name + ".json"))
    return target, marker


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    path = tmp_path_factory.mktemp("pt2-input") / "x.npy"
    np.save(path, np.ones((2, 3), dtype=np.float32))
    return path


@pytest.mark.slow
def test_plain_torch_export_load_runs_the_payloads(base, tmp_path):
    """The attacks are real: torch.export.load (and one call of the module) runs each payload."""
    proven = [name for name, (_, _, runs) in ATTACKS.items() if runs]
    built = {name: _build(base, tmp_path, name) for name in proven}
    script = textwrap.dedent(
        """
        import sys, torch
        for path in sys.argv[1:]:
            try:
                torch.export.load(path).module()(torch.zeros(2, 3))
            except Exception:
                pass
        """
    )
    paths = [str(path) for path, _ in built.values()]
    subprocess.run([sys.executable, "-c", script, *paths], capture_output=True, check=True, timeout=300)
    ran = {name for name, (_, marker) in built.items() if marker.exists()}
    assert ran == set(proven), f"torch.export.load no longer runs {sorted(set(proven) - ran)}; update ATTACKS"


@pytest.mark.parametrize("name", list(ATTACKS))
def test_load_exported_refuses_the_attack_before_it_runs(base, tmp_path, name):
    path, marker = _build(base, tmp_path, name)
    with pytest.raises(TrainwiseError) as caught:
        load_exported(path)(torch.zeros(2, 3))
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and message.endswith(".")
    assert ATTACKS[name][1] in message
    assert not marker.exists()


@pytest.mark.parametrize("name", list(ATTACKS))
def test_predict_refuses_the_attack_with_one_line(base, batch, tmp_path, name, capfd):
    path, marker = _build(base, tmp_path, name)
    assert main(["predict", str(path), str(batch)]) == 2
    captured = capfd.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1 and "refusing" in captured.err
    assert not marker.exists()


@pytest.mark.slow
def test_predict_in_a_fresh_process_exits_2_without_running_the_payload(base, batch, tmp_path):
    path, marker = _build(base, tmp_path, "pickled-weight")
    proc = subprocess.run(
        [sys.executable, "-m", "trainwise.cli", "predict", str(path), str(batch)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert "use_pickle" in proc.stderr and "export the model again" in proc.stderr
    assert not marker.exists()


def test_a_clean_export_still_loads_and_runs(base):
    path, model = base
    x = torch.randn(5, 3)
    with torch.no_grad():
        torch.testing.assert_close(load_exported(path)(x), model(x))


# -- fuzzing ----------------------------------------------------------------------------------------------------

_NASTY = [
    None,
    True,
    -1,
    2**70,
    1.5,
    "",
    "x=__import__('os')",
    "__import__('pathlib').Path('MARK').touch()",
    'a"b',
    [],
    {},
    [[[[[]]]]],
    {"as_expr": {"expr_str": "__import__('os')", "hint": None}},
]


def _mutate_json(rng: random.Random, data, marker: pathlib.Path):
    """Replace one randomly chosen value (or drop one key) somewhere in a JSON tree."""
    spots = []

    def walk(node):
        if isinstance(node, dict):
            for key in node:
                spots.append((node, key))
                walk(node[key])
        elif isinstance(node, list):
            for index in range(len(node)):
                spots.append((node, index))
                walk(node[index])

    walk(data)
    if not spots:
        return _NASTY[rng.randrange(len(_NASTY))]
    container, key = spots[rng.randrange(len(spots))]
    if isinstance(container, dict) and rng.random() < 0.25:
        del container[key]
        return data
    value = _NASTY[rng.randrange(len(_NASTY))]
    container[key] = value.replace("MARK", str(marker)) if isinstance(value, str) else value
    return data


def _fuzz_case(rng: random.Random, raw: bytes, root: str, entries: dict[str, bytes], marker: pathlib.Path) -> bytes:
    kind = rng.choice(["flip", "truncate", "swap", "pickle", "json", "json", "drop"])
    if kind == "flip":
        data = bytearray(raw)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return bytes(data)
    if kind == "truncate":
        return raw[: rng.randrange(len(raw))]
    mutated = dict(entries)
    names = sorted(mutated)
    if kind == "swap":
        a, b = rng.sample(names, 2)
        mutated[a], mutated[b] = mutated[b], mutated[a]
    elif kind == "pickle":
        name = rng.choice(names)
        payload = pickle.dumps(_Touch(marker), protocol=2)
        mutated[name] = payload if rng.random() < 0.5 else mutated[name][:16] + payload
        if name != WEIGHTS and rng.random() < 0.5:  # and tell the loader to unpickle it
            config = json.loads(mutated[WEIGHTS])
            for meta in config["config"].values():
                meta["use_pickle"] = True
            mutated[WEIGHTS] = json.dumps(config).encode()
    elif kind == "json":
        name = rng.choice([n for n in names if n.endswith(".json")])
        mutated[name] = json.dumps(_mutate_json(rng, json.loads(mutated[name]), marker)).encode()
    else:
        del mutated[rng.choice(names)]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, data in mutated.items():
            archive.writestr(f"{root}/{name}", data)
    return buffer.getvalue()


def test_fuzzed_archives_give_trainwise_error_or_a_working_model_never_code(base, tmp_path):
    path, _ = base
    raw = path.read_bytes()
    root, entries = _entries(path)
    rng = random.Random(20240610)
    marker = tmp_path / "fuzz.marker"
    outcomes = {"refused": 0, "loaded": 0}
    for case in range(40):
        target = tmp_path / f"case{case}.pt2"
        target.write_bytes(_fuzz_case(rng, raw, root, entries, marker))
        try:
            model = load_exported(target)
        except TrainwiseError as exc:
            assert len(str(exc).splitlines()) == 1, f"case {case}: {exc}"
            outcomes["refused"] += 1
        else:
            outcomes["loaded"] += 1
            with contextlib.suppress(Exception):  # a mutated weight may break the run; running code must not happen
                model(torch.zeros(2, 3))
        assert not marker.exists(), f"case {case} ran the payload"
    assert outcomes["refused"] > 20  # most mutations are caught by the structure check


def test_fuzzed_sidecars_give_trainwise_error_or_a_working_model(base, tmp_path):
    path, _ = base
    sidecar = json.loads(path.with_name(path.name + ".json").read_text())
    rng = random.Random(7)
    artifact = tmp_path / "model.pt2"
    shutil.copyfile(path, artifact)
    for case in range(30):
        mutated = _mutate_json(rng, json.loads(json.dumps(sidecar)), tmp_path / "sidecar.marker")
        artifact.with_name(artifact.name + ".json").write_text(json.dumps(mutated))
        try:
            model = load_exported(artifact)
            model(torch.zeros(2, 3))
        except TrainwiseError as exc:
            assert len(str(exc).splitlines()) == 1, f"case {case}: {exc}"


# -- the grammars that stand between the archive's strings and eval/exec ----------------------------------------

PLAIN_GUARDS = [
    "L['ids'].size()[0] == L['w'].size()[0]",
    "2 <= L['x'].size()[0]",
    "L['x'].size()[0] <= 64 and L['x'].size()[0] % 2 == 0",
    "L['x'].stride()[0] == 2 * L['x'].size()[1]",
    "not math.isnan(L['scale'])",
]
CODE_GUARDS = [
    "__import__('os').system('true')",
    "L['x'].__class__ is None",
    "L['x\"]'].size()[0] == 1",
    "(lambda: 1)() == 1",
    "getattr(L, 'x') is None",
    "math.os is None",
    "L['x'].size()[0] ** 10**100 == 1",
    "[c for c in ()] == []",
    "open('f') is None",
]
PLAIN_EXPRESSIONS = [
    "Symbol('s77', positive=True, integer=True)",
    "Mul(Integer(2), Symbol('s28', positive=True, integer=True))",
    "Min(Integer(16), Mul(Integer(16), Symbol('s28', positive=True, integer=True)))",
    "FloorDiv(Symbol('s0', integer=True, positive=True), Integer(2))",
    "Float('1.5', precision=53)",
    "Rational(1, 2)",
    "-int_oo",
]
CODE_EXPRESSIONS = [
    "__import__('os').system('true')",
    "Symbol('s0').__class__",
    "Max('__import__(1)', Integer(1))",
    "Function('f')(Integer(1))",
    "Pow(Integer(10), Integer(10000000000))",
    "exec('1')",
    "Symbol('s0', positive=open)",
    "Symbol('a b')",
    "lambda: 1",
]


@pytest.mark.parametrize("guard", PLAIN_GUARDS)
def test_plain_guards_pass(guard):
    from trainwise.exporting.pt2_check import is_plain_guard

    assert is_plain_guard(guard)


@pytest.mark.parametrize("guard", CODE_GUARDS)
def test_guards_that_could_run_code_are_refused(guard):
    from trainwise.exporting.pt2_check import is_plain_guard

    assert not is_plain_guard(guard)


@pytest.mark.parametrize("expression", PLAIN_EXPRESSIONS)
def test_plain_shape_expressions_pass(expression):
    from trainwise.exporting.pt2_check import is_plain_sympy

    assert is_plain_sympy(expression)


@pytest.mark.parametrize("expression", CODE_EXPRESSIONS)
def test_shape_expressions_that_could_run_code_are_refused(expression):
    from trainwise.exporting.pt2_check import is_plain_sympy

    assert not is_plain_sympy(expression)


# -- operator names: what the registry has, not what a name pattern allows ------------------------------------------


def _targets(path: pathlib.Path) -> set[str]:
    found = set()

    def walk(node, key=""):
        if isinstance(node, dict):
            for child_key, child in node.items():
                walk(child, child_key)
        elif isinstance(node, list):
            for child in node:
                walk(child, key)
        elif key in ("target", "as_operator"):
            found.add(node)

    walk(_json(_entries(path)[1], MODEL))
    return found


class _Masks(nn.Module):
    """Bitwise tensor operators (as in attention masks) and a shape computed from the dynamic batch."""

    def forward(self, x):
        keep = ((x > 0) & (x < 1)) | ~(x > -1) ^ (x > 2)
        return x.masked_fill(keep, 0.0).reshape(x.shape[0] * 2, -1)


def test_every_operator_of_a_real_export_passes_and_loads(tmp_path):
    """aten.__and__.Tensor and friends are real operators: the artifact that export writes loads back."""
    path = tmp_path / "masks.pt2"
    trainwise.export(_Masks(), torch.randn(2, 4), path)
    targets = _targets(path)
    assert {"torch.ops.aten.__and__.Tensor", "torch.ops.aten.__or__.Tensor", "torch.ops.aten.__xor__.Tensor"} <= targets
    assert "_operator.mul" in targets  # symbolic math on the dynamic batch
    x = torch.randn(5, 4)
    torch.testing.assert_close(load_exported(path)(x), _Masks()(x))


@pytest.mark.parametrize(
    "target",
    [
        "torch.ops.aten.__and__.Tensor",
        "torch.ops.aten.__or__.Scalar",
        "torch.ops.aten.__lshift__.Tensor",
        "torch.ops.aten.linear.default",
        "torch.ops.aten.sym_size.int",
        "torch.ops.prims.add.default",
        "torch.ops.higher_order.cond",
        "_operator.add",
        "_operator.floordiv",
        "math.trunc",
        "torch.sym_max",
        "torch._sym_sqrt",
    ],
)
def test_registered_operators_and_symbolic_math_pass(target):
    from trainwise.exporting.pt2_check import check_target

    check_target(target)


@pytest.mark.parametrize(
    ("target", "unsafe", "fragment"),
    [
        ("torch.ops.aten.__class__.__init__", True, "would reach Python attributes"),
        ("torch.ops.aten.__getattr__.default", True, "would reach Python attributes"),
        ("torch.ops.aten.__and__.__class__", True, "would reach Python attributes"),
        ("torch.ops.aten.add.__call__", True, "would reach Python attributes"),
        ("torch.ops.aten.no_such_operator.default", False, "not an operator of this torch"),
        ("torch.ops.aten.__and__.NoSuchOverload", False, "not an operator of this torch"),
        ("torch.ops.evil_lib.touch.default", True, "the library 'evil_lib'"),
        ("torch.ops.higher_order.run_anything", True, "something other than a PyTorch operator"),
        ("torch.ops.aten.save.default", True, "touches files"),
        ("torch.ops.aten.from_file.default", True, "touches files"),
        ("torch.os.system", True, "something other than a PyTorch operator"),
        ("_operator.getitem", True, "something other than a PyTorch operator"),
        ("_operator.attrgetter", True, "something other than a PyTorch operator"),
        ("builtins.exec", True, "something other than a PyTorch operator"),
        ("#evil_extension", True, "something other than a PyTorch operator"),
        ("torch.ops.aten.add", True, "something other than a PyTorch operator"),
    ],
)
def test_names_that_only_look_like_operators_are_refused(target, unsafe, fragment):
    from trainwise.exporting.pt2_check import Refused, check_target

    with pytest.raises(Refused) as refused:
        check_target(target)
    assert refused.value.unsafe is unsafe and fragment in refused.value.what


def test_an_operator_of_another_library_is_refused_with_what_to_do_instead(base, tmp_path):
    path, _ = _build(base, tmp_path, "custom-library")
    with pytest.raises(TrainwiseError) as caught:
        load_exported(path)
    message = str(caught.value)
    assert "refusing to load" in message and "not of torch's own aten or prims" in message
    assert "export the model again" not in message  # exporting again would write the same operator
    assert "torch.export.load only in a process that registers that operator" in message
