"""Untrusted TorchScript and ONNX artifacts: nothing in them runs unless the caller says it trusts the file.

``torch.jit.load`` compiles a TorchScript archive's code and runs its ``__setstate__`` methods (the first test
shows one creating a file through ``torch.from_file``), so :func:`load_exported` and ``trainwise predict`` refuse
TorchScript unless given ``trust_code=True`` / ``--trust-code``, before torch reads the file. An ONNX graph is
parsed with the ``onnx`` package first and refused when a node names an operator domain onnxruntime does not run
natively (one needing a native library) or a tensor's external data lies outside the artifact's folder.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest
import torch

import trainwise
from trainwise.cli import main
from trainwise.errors import TrainwiseError
from trainwise.exporting import load_exported

try:
    import onnx
    import onnxruntime  # noqa: F401
    import onnxscript  # noqa: F401
    from onnx import TensorProto, helper, numpy_helper

    HAVE_ONNX = True
except ImportError:
    HAVE_ONNX = False
# The test builds TorchScript files itself, with torch.jit calls that torch 2.13 marks deprecated.
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated:DeprecationWarning")
needs_onnx = pytest.mark.skipif(not HAVE_ONNX, reason="onnx, onnxscript or onnxruntime is not installed")


class _CreatesAFile(torch.nn.Module):
    """Its TorchScript ``__setstate__``, run by ``torch.jit.load``, creates ``marker`` (``torch.from_file`` with
    ``shared=True`` opens the path for writing)."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker = marker

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @torch.jit.export
    def __getstate__(self) -> tuple[str, bool]:
        return (self.marker, self.training)

    @torch.jit.export
    def __setstate__(self, state: tuple[str, bool]) -> None:
        self.marker = state[0]
        self.training = bool(torch.from_file(self.marker, True, 4).sum() == 0) and state[1]


@pytest.fixture()
def hostile(tmp_path) -> tuple[pathlib.Path, pathlib.Path]:
    marker = tmp_path / "ran.marker"
    path = tmp_path / "hostile.torchscript"
    torch.jit.save(torch.jit.script(_CreatesAFile(str(marker))), str(path))
    assert not marker.exists()
    return path, marker


@pytest.fixture()
def jit_loads(monkeypatch) -> list[tuple]:
    """Every call of torch.jit.load from here on (each fails: the test reads the list, not an error)."""
    calls: list[tuple] = []

    def record(*args, **kwargs):
        calls.append(args)
        raise AssertionError("torch.jit.load was called")

    monkeypatch.setattr(torch.jit, "load", record)
    return calls


def _refusal(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message and "trust_code=True" in message, message
    return message


def test_plain_torch_jit_load_runs_the_archive_code(hostile):
    path, marker = hostile
    torch.jit.load(str(path))
    assert marker.exists()  # the attack works on this torch: what the refusal below keeps from running


def test_torchscript_is_refused_without_trust_and_never_read_by_torch(hostile, jit_loads):
    path, marker = hostile
    with pytest.raises(TrainwiseError) as refused:
        load_exported(path)
    message = _refusal(refused)
    assert str(path) in message and ".pt2" in message
    assert not marker.exists() and not jit_loads


def test_torchscript_loads_with_trust_code(tmp_path):
    path = tmp_path / "lin.torchscript"
    model = torch.nn.Linear(3, 2).eval()
    torch.jit.save(torch.jit.script(model), str(path))
    x = torch.randn(4, 3)
    torch.testing.assert_close(load_exported(path, trust_code=True)(x), model(x))


def test_hostile_torchscript_runs_only_when_trusted(hostile):
    path, marker = hostile
    with pytest.raises(TrainwiseError):
        load_exported(path)
    assert not marker.exists()
    load_exported(path, trust_code=True)(torch.ones(2))
    assert marker.exists()  # trusting it is trusting it like code


@pytest.mark.parametrize("name", ["model.pt2", "model.bin", "model.ts"])
def test_a_sidecar_cannot_switch_a_file_to_torchscript(hostile, jit_loads, tmp_path, name):
    path, marker = hostile
    artifact = tmp_path / name
    artifact.write_bytes(path.read_bytes())
    artifact.with_name(name + ".json").write_text('{"format": "torchscript", "inputs": [], "outputs": []}')
    with pytest.raises(TrainwiseError):
        load_exported(artifact)
    if name == "model.pt2":  # the suffix says .pt2: not even trust lets the sidecar decide
        with pytest.raises(TrainwiseError, match="says format"):
            load_exported(artifact, trust_code=True)
    assert not marker.exists() and not jit_loads


def test_format_torchscript_still_needs_trust(hostile, jit_loads, tmp_path):
    path, marker = hostile
    artifact = tmp_path / "named.pt2"
    artifact.write_bytes(path.read_bytes())
    with pytest.raises(TrainwiseError) as refused:
        load_exported(artifact, format="torchscript")
    _refusal(refused)
    assert not marker.exists() and not jit_loads


def test_export_verifies_its_own_torchscript_and_loads_it_with_trust(tmp_path):
    model = torch.nn.Linear(3, 2)
    report = trainwise.export(model, torch.randn(2, 3), tmp_path / "own.torchscript", "torchscript")
    assert report.verified
    with pytest.raises(TrainwiseError, match="trust_code=True"):
        load_exported(report.path)
    x = torch.randn(5, 3)
    torch.testing.assert_close(load_exported(report.path, trust_code=True)(x), model(x))


# -- ONNX --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory):
    if not HAVE_ONNX:
        pytest.skip("onnx, onnxscript or onnxruntime is not installed")
    folder = tmp_path_factory.mktemp("onnx-plain")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).eval()
    path = trainwise.export(model, torch.randn(2, 6), folder / "m.onnx", "onnx").path
    return path, model


@needs_onnx
def test_a_plain_onnx_export_loads_without_trust(onnx_model):
    path, model = onnx_model
    x = torch.randn(4, 6)
    torch.testing.assert_close(load_exported(path)(x), model(x).detach(), atol=1e-5, rtol=1e-5)


def _with_external_weight(source: pathlib.Path, folder: pathlib.Path, location: str, data_at: pathlib.Path):
    """The model at ``source`` with its first initializer moved to external data named ``location``."""
    model = onnx.load(str(source))
    tensor = model.graph.initializer[0]
    data_at.write_bytes(numpy_helper.to_array(tensor).tobytes())
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", location
    folder.mkdir(exist_ok=True)
    onnx.save(model, str(folder / "m.onnx"))
    return folder / "m.onnx"


@needs_onnx
def test_external_data_inside_the_folder_loads_without_trust(onnx_model, tmp_path):
    path, model = onnx_model
    artifact = _with_external_weight(path, tmp_path / "art", "weights.bin", tmp_path / "art-weights.bin")
    (tmp_path / "art-weights.bin").rename(tmp_path / "art" / "weights.bin")
    x = torch.randn(3, 6)
    torch.testing.assert_close(load_exported(artifact)(x), model(x).detach(), atol=1e-5, rtol=1e-5)


@needs_onnx
@pytest.mark.parametrize("where", ["parent", "absolute", "symlink-out", "ort-memory-address"])
def test_external_data_outside_the_folder_is_refused(onnx_model, tmp_path, where):
    path, _ = onnx_model
    outside = tmp_path / "outside.bin"
    location = {"parent": "../outside.bin", "absolute": str(outside), "symlink-out": "link.bin",
                "ort-memory-address": "*/_ORT_MEM_ADDR_/*"}[where]
    artifact = _with_external_weight(path, tmp_path / "art", location, outside)
    if where == "symlink-out":
        os.symlink(outside, tmp_path / "art" / "link.bin")
    with pytest.raises(TrainwiseError) as refused:
        load_exported(artifact)
    message = _refusal(refused)
    assert "refusing" in message and "external data" in message
    # Trusted, it goes to onnxruntime as before (which has its own path checks in recent versions).
    try:
        load_exported(artifact, trust_code=True)
    except TrainwiseError as exc:
        assert "refusing" not in str(exc) and "not a readable ONNX" in str(exc)


@needs_onnx
def test_external_data_of_a_constant_in_a_subgraph_is_refused(onnx_model, tmp_path):
    path, _ = onnx_model
    model = onnx.load(str(path))
    value = helper.make_tensor("hidden", TensorProto.FLOAT, [2], [0.0, 0.0])
    value.ClearField("float_data")
    value.data_location = TensorProto.EXTERNAL
    entry = value.external_data.add()
    entry.key, entry.value = "location", "sub/../../outside.bin"
    (tmp_path / "outside.bin").write_bytes(np.zeros(2, np.float32).tobytes())
    inner = helper.make_graph([helper.make_node("Constant", [], ["c"], value=value)], "body", [],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2])])
    model.graph.initializer.append(helper.make_tensor("cond", TensorProto.BOOL, [], [True]))
    model.graph.node.insert(0, helper.make_node("If", ["cond"], ["unused"], then_branch=inner, else_branch=inner))
    (tmp_path / "art").mkdir()
    artifact = tmp_path / "art" / "nested.onnx"
    onnx.save(model, str(artifact))
    with pytest.raises(TrainwiseError) as refused:
        load_exported(artifact)
    message = _refusal(refused)
    assert "'hidden'" in message and "subgraph of node 'If'" in message and "outside the artifact's folder" in message


@needs_onnx
@pytest.mark.parametrize("where", ["graph", "if-branch", "function"])
def test_a_node_of_a_custom_domain_is_refused(onnx_model, tmp_path, where):
    path, _ = onnx_model
    model = onnx.load(str(path))
    model.opset_import.append(helper.make_opsetid("evil.custom", 1))
    if where == "graph":
        model.graph.node[0].domain = "evil.custom"
    elif where == "if-branch":  # a subgraph of an If node
        first = model.graph.node[0]
        inner = helper.make_graph(
            [helper.make_node(first.op_type, list(first.input), ["branch_out"], domain="evil.custom")],
            "branch", [], [helper.make_tensor_value_info("branch_out", TensorProto.FLOAT, None)])
        cond = helper.make_tensor("cond", TensorProto.BOOL, [], [True])
        model.graph.initializer.append(cond)
        model.graph.node.insert(0, helper.make_node("If", ["cond"], ["unused"], then_branch=inner,
                                                    else_branch=inner))
    else:  # a local function whose body calls the custom op
        model.functions.append(helper.make_function(
            "local.fn", "Wrap", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"], domain="evil.custom")],
            [helper.make_opsetid("", 20), helper.make_opsetid("evil.custom", 1)]))
        model.opset_import.append(helper.make_opsetid("local.fn", 1))
        relu = next(node for node in model.graph.node if node.op_type == "Relu")
        relu.op_type, relu.domain = "Wrap", "local.fn"
    artifact = tmp_path / "custom.onnx"
    onnx.save(model, str(artifact))
    with pytest.raises(TrainwiseError) as refused:
        load_exported(artifact)
    message = _refusal(refused)
    assert "evil.custom" in message
    try:  # trusted: onnxruntime decides (it has no kernel for evil.custom, so it cannot run it either)
        load_exported(artifact, trust_code=True)
    except TrainwiseError as exc:
        assert "refusing" not in str(exc)


@needs_onnx
def test_a_local_function_of_standard_ops_loads_without_trust(onnx_model, tmp_path):
    path, model_eager = onnx_model
    model = onnx.load(str(path))
    model.functions.append(helper.make_function(
        "local.fn", "Wrap", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"])], [helper.make_opsetid("", 20)]))
    model.opset_import.append(helper.make_opsetid("local.fn", 1))
    relu = next(node for node in model.graph.node if node.op_type == "Relu")
    relu.op_type, relu.domain = "Wrap", "local.fn"
    artifact = tmp_path / "local.onnx"
    onnx.save(model, str(artifact))
    x = torch.randn(2, 6)
    torch.testing.assert_close(load_exported(artifact)(x), model_eager(x).detach(), atol=1e-5, rtol=1e-5)


@needs_onnx
def test_onnx_without_the_onnx_package_is_refused_unless_trusted(onnx_model, monkeypatch):
    import sys

    path, _ = onnx_model
    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(TrainwiseError) as refused:
        load_exported(path)
    assert "pip install" in _refusal(refused)
    assert load_exported(path, trust_code=True)(torch.randn(2, 6)).shape == (2, 3)


# -- the command line --------------------------------------------------------------------------------------


def test_predict_refuses_torchscript_without_trust_code(hostile, tmp_path, capfd):
    path, marker = hostile
    batch = tmp_path / "x.npy"
    np.save(batch, np.ones(3, dtype=np.float32))
    assert main(["predict", str(path), str(batch)]) == 2
    captured = capfd.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert lines[0].startswith("trainwise predict: error: ") and "--trust-code" in lines[0]
    assert "trust_code" not in lines[0]
    assert not marker.exists()
    assert main(["predict", str(path), str(batch), "--trust-code", "--json"]) == 0
    assert '"outputs"' in capfd.readouterr().out
    assert marker.exists()
