"""Export (fundamental 11): every format round-trips with parity, in eval mode, loadable without the source.

The exports are shared through module-scoped fixtures: torch.export and the ONNX exporter take seconds on CPU.
"""

import json
import subprocess
import sys
import textwrap
import uuid
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import trainwise
from trainwise.demo import DigitsCNN
from trainwise.errors import TrainwiseError
from trainwise.evaluation import training_modes
from trainwise.exporting import SUFFIXES, ExportParityError, ExportWarning, load_exported

try:
    import onnx  # noqa: F401
    import onnxruntime  # noqa: F401
    import onnxscript  # noqa: F401

    HAVE_ONNX = True
except ImportError:
    HAVE_ONNX = False

TOL = {"atol": 1e-5, "rtol": 1e-5}


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))


def _cnn() -> nn.Module:
    model = DigitsCNN(width=8, dropout=0.5)
    with torch.no_grad():  # move the BatchNorm running statistics away from (0, 1): eval and train must differ
        for _ in range(3):
            model(torch.randn(16, 1, 8, 8) * 2 + 0.5)
    return model


def _transformer() -> nn.Module:
    return nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.1, batch_first=True)


# name: (factory, example shape); the batch sizes 1, 2 and 3 cover the 0/1 specialisation of torch.export.
MODELS = {
    "mlp": (_mlp, (1, 6)),
    "cnn": (_cnn, (2, 1, 8, 8)),
    "transformer": (_transformer, (3, 5, 16)),
}


def _build(name: str) -> tuple[nn.Module, torch.Tensor]:
    factory, shape = MODELS[name]
    torch.manual_seed(0)
    model = factory()
    model.train()
    first = next(m for m in model.modules() if m is not model)
    first.eval()  # a submodule the user keeps in eval mode: must stay so after export
    return model, torch.randn(shape)


def _eval_outputs(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    modes = training_modes(model)
    with trainwise.evaluating(model):
        out = model(x)
    assert training_modes(model) == modes
    return out


def _load_own(path, **kwargs):
    """An artifact this test has just exported: a TorchScript program is trusted (its bytes are the test's own,
    and load_exported refuses it otherwise); the other formats are checked as any file."""
    return load_exported(path, trust_code=str(path).endswith(".torchscript"), **kwargs)


def _export_params():
    for name in MODELS:
        for format in ("torch.export", "torchscript", "onnx"):
            marks = [pytest.mark.skipif(not HAVE_ONNX, reason="onnx, onnxscript or onnxruntime absent")]
            yield pytest.param((name, format), marks=marks if format == "onnx" else [], id=f"{name}-{format}")


@pytest.fixture(scope="module", params=list(_export_params()))
def exported(request, tmp_path_factory):
    name, format = request.param
    model, example = _build(name)
    modes = training_modes(model)
    path = tmp_path_factory.mktemp("export") / f"{name}{SUFFIXES[format]}"
    report = trainwise.export(model, example, path, format)
    return {"model": model, "example": example, "report": report, "path": path, "modes": modes, "format": format}


@pytest.mark.slow
def test_round_trip_parity_at_three_batch_sizes(exported):
    model, example, report = exported["model"], exported["example"], exported["report"]
    assert report.verified and report.path == exported["path"] and exported["path"].is_file()
    assert report.max_abs_diff is not None and report.max_abs_diff <= 1e-4
    assert len(report.batch_sizes) == 3 and example.shape[0] in report.batch_sizes and 1 in report.batch_sizes
    assert training_modes(model) == exported["modes"]  # exported in train mode, every mode restored
    run = _load_own(exported["path"], device="cpu")
    assert run.format == exported["format"]
    for batch in (example.shape[0], 1, 4, 7):
        x = torch.randn(batch, *example.shape[1:])
        torch.testing.assert_close(run(x), _eval_outputs(model, x), **TOL)


@pytest.mark.slow
def test_train_mode_export_gives_eval_outputs(exported):
    model, example = exported["model"], exported["example"]
    if not any(isinstance(m, (nn.Dropout, nn.BatchNorm2d)) and m.training for m in model.modules()):
        pytest.skip("no train-mode dropout or BatchNorm left")
    run = _load_own(exported["path"])
    x = torch.randn(8, *example.shape[1:])
    torch.manual_seed(1)
    with torch.no_grad():
        train_out = model(x)  # dropout on, BatchNorm on batch statistics
    assert model.training
    assert not torch.allclose(run(x), train_out, atol=1e-3)
    torch.testing.assert_close(run(x), _eval_outputs(model, x), **TOL)


def test_sidecar_records_format_shapes_versions_and_parity(exported):
    sidecar = exported["path"].with_name(exported["path"].name + ".json")
    assert exported["report"].sidecar == sidecar
    meta = json.loads(sidecar.read_text())
    example = exported["example"]
    assert meta["format"] == exported["format"] and meta["dynamic_batch"] is True
    (spec,) = meta["inputs"]
    assert spec["shape"] == ["batch", *example.shape[1:]] and spec["dtype"] == "float32"
    assert meta["outputs"][0]["shape"][0] == "batch"
    assert meta["versions"]["torch"] == torch.__version__ and meta["versions"]["trainwise"] == trainwise.__version__
    parity = meta["parity"]
    assert parity["verified"] is True and parity["max_abs_diff"] <= parity["atol"] + 1e-4
    assert sorted(parity["batch_sizes"]) == sorted(exported["report"].batch_sizes)
    assert sorted(p.name for p in exported["path"].parent.iterdir()) == sorted([exported["path"].name, sidecar.name])


def test_loaded_artifact_checks_inputs_against_the_sidecar(exported):
    run = _load_own(exported["path"])
    shape = exported["example"].shape
    with pytest.raises(TrainwiseError, match="must be float32, got float64"):
        run(torch.randn(2, *shape[1:], dtype=torch.float64))
    with pytest.raises(TrainwiseError, match=r"add the batch dimension"):
        run(torch.randn(*shape[1:]))
    out = run(np.random.default_rng(0).standard_normal((2, *shape[1:]), dtype=np.float32))  # NumPy arrays too
    assert isinstance(out, torch.Tensor) and out.shape[0] == 2


# -- a fresh process where the model's module cannot be imported ---------------------------------------

MODEL_SOURCE = '''
import torch
from torch import nn


class FreshNet(nn.Module):
    """BatchNorm, dropout and a data-dependent branch (scripting keeps it; torch.export needs no branch here)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(5, 12), nn.BatchNorm1d(12), nn.ReLU(), nn.Dropout(0.4))
        self.head = nn.Linear(12, 2)

    def forward(self, x):
        return self.head(self.body(x)).tanh() * 3
'''

BLOCKED_RUNNER = """
import importlib.abc, json, sys
import numpy as np

MODULE, FOLDER = sys.argv[1], sys.argv[2]


class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == MODULE or name.startswith(MODULE + "."):
            raise ImportError(f"{name} is blocked: the artifact must load without the model's source")
        return None


sys.meta_path.insert(0, Blocker())
sys.path[:] = [p for p in sys.path if p not in (FOLDER, "")]
try:
    __import__(MODULE)
except ImportError:
    pass
else:
    raise SystemExit("the model module is importable, so this test would prove nothing")

from trainwise import load_exported

results = {}
for artifact in sys.argv[3:]:
    run = load_exported(artifact, trust_code=artifact.endswith(".torchscript"))  # the test's own TorchScript
    for batch in (1, 4):
        x = np.load(f"{FOLDER}/x{batch}.npy")
        expected = np.load(f"{FOLDER}/y{batch}.npy")
        got = run(x).numpy()
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)
    results[artifact] = run.format
assert MODULE not in sys.modules
print(json.dumps(results))
"""


@pytest.mark.slow
def test_artifacts_load_in_a_fresh_process_without_the_model_source(tmp_path):
    module = f"tw_fresh_model_{uuid.uuid4().hex[:8]}"
    source = tmp_path / "src"
    source.mkdir()
    (source / f"{module}.py").write_text(MODEL_SOURCE)
    sys.path.insert(0, str(source))
    try:
        fresh = __import__(module)
        torch.manual_seed(0)
        model = fresh.FreshNet()
        with torch.no_grad():
            model(torch.randn(32, 5) + 1)  # non-trivial running statistics
    finally:
        sys.path.remove(str(source))
        sys.modules.pop(module, None)
    formats = ["torch.export", "torchscript"] + (["onnx"] if HAVE_ONNX else [])
    artifacts = []
    for format in formats:
        path = tmp_path / f"fresh{SUFFIXES[format]}"
        trainwise.export(model, torch.randn(2, 5), path, format)
        artifacts.append(str(path))
    for batch in (1, 4):
        x = torch.randn(batch, 5)
        np.save(source / f"x{batch}.npy", x.numpy())
        np.save(source / f"y{batch}.npy", _eval_outputs(model, x).numpy())
    runner = tmp_path / "runner" / "run_blocked.py"
    runner.parent.mkdir()
    runner.write_text(BLOCKED_RUNNER)
    proc = subprocess.run(
        [sys.executable, str(runner), module, str(source), *artifacts],
        capture_output=True,
        text=True,
        cwd=runner.parent,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert set(json.loads(proc.stdout.strip().splitlines()[-1]).values()) == set(formats)


# -- what cannot be exported, and bad input ------------------------------------------------------------------


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        y = self.linear(x)
        if y.sum() > 0:  # a branch on a tensor's value
            return y * 2
        return y - 1


class FixedBatch(nn.Module):
    def forward(self, x):
        return x.reshape(2, -1).sum(1)


class VarArgs(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, *xs):  # TorchScript cannot script *args
        return self.linear(xs[0])


class ScriptDiffers(nn.Module):
    def forward(self, x):
        if torch.jit.is_scripting():
            return x + 0.5
        return x


class Returns(nn.Module):
    def __init__(self, value):
        super().__init__()
        self.value = value
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        y = self.linear(x)
        return {"logits": y} if self.value == "dict" else "not a tensor"


def test_data_dependent_control_flow_names_the_construct_and_a_format_that_works(tmp_path):
    model = DataDependent()
    with pytest.raises(TrainwiseError) as info:
        trainwise.export(model, torch.randn(2, 4), tmp_path / "dd.pt2")
    message = str(info.value)
    assert "data-dependent control flow" in message and "if y.sum() > 0" in message
    assert "format='torchscript'" in message and "\n" not in message
    assert not (tmp_path / "dd.pt2").exists() and list(tmp_path.iterdir()) == []
    report = trainwise.export(model, torch.randn(2, 4), tmp_path / "dd.torchscript", "torchscript")  # the fix
    run = _load_own(report.path)
    for x in (torch.full((3, 4), 5.0), torch.full((3, 4), -5.0)):  # both branches survive scripting
        torch.testing.assert_close(run(x), _eval_outputs(model, x))


def test_a_batch_fixed_in_the_code_names_dynamic_batch_false(tmp_path):
    with pytest.raises(TrainwiseError, match="dynamic_batch=False"):
        trainwise.export(FixedBatch(), torch.randn(2, 4), tmp_path / "fixed.pt2")
    report = trainwise.export(FixedBatch(), torch.randn(2, 4), tmp_path / "fixed.pt2", dynamic_batch=False)
    assert report.verified and report.batch_sizes == (2,)
    meta = json.loads(report.sidecar.read_text())
    assert meta["inputs"][0]["shape"] == [2, 4] and meta["dynamic_batch"] is False
    with pytest.raises(TrainwiseError, match=r"must have shape \(2, 4\)"):
        load_exported(report.path)(torch.randn(3, 4))


def test_torchscript_falls_back_to_tracing_with_a_warning(tmp_path):
    torch.manual_seed(0)
    model = VarArgs()
    with pytest.warns(ExportWarning, match="freezes data-dependent control flow"):
        report = trainwise.export(model, torch.randn(2, 4), tmp_path / "va.torchscript", "torchscript")
    assert report.method == "trace" and report.verified
    x = torch.randn(5, 4)
    torch.testing.assert_close(_load_own(report.path)(x), _eval_outputs(model, x))


def test_parity_failure_raises_and_keeps_the_previous_file(tmp_path):
    target = tmp_path / "model.torchscript"
    target.write_bytes(b"a good artifact from yesterday")
    with pytest.raises(ExportParityError, match=r"differs from the eager model by up to 0\.5") as info:
        trainwise.export(ScriptDiffers(), torch.randn(2, 3), target, "torchscript")
    assert info.value.report.max_abs_diff == pytest.approx(0.5)
    assert target.read_bytes() == b"a good artifact from yesterday"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.torchscript"]  # no sidecar, no staging left
    report = trainwise.export(ScriptDiffers(), torch.randn(2, 3), target, "torchscript", atol=0.6)
    assert report.verified and report.atol == 0.6


@pytest.mark.parametrize(
    ("example", "match"),
    [
        (torch.randn(2, 5), r"fails on the example inputs \(input: float32\[2, 5\]\).*shape"),
        (torch.ones(2, 4, dtype=torch.int64), r"int64\[2, 4\].*dtype.*parameters are float32"),
        (torch.randn(2, 4, dtype=torch.float64), r"float64\[2, 4\].*dtype"),
        ([torch.randn(2, 4), 3], "example input 1 is of type int"),
        ({"x": torch.randn(2, 4)}, "positionally as a tuple"),
        ("not a tensor", "must be a tensor or a non-empty tuple of tensors"),
    ],
    ids=["shape", "int-dtype", "double-dtype", "not-tensor", "dict", "string"],
)
def test_bad_example_inputs_are_one_sentence(tmp_path, example, match):
    model = nn.Sequential(nn.Linear(4, 3))
    with pytest.raises(TrainwiseError, match=match) as info:
        trainwise.export(model, example, tmp_path / "m.pt2")
    assert "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("kind", "match"), [("dict", "returns a dict"), ("str", "returns a str")])
def test_outputs_must_be_tensors(tmp_path, kind, match):
    with pytest.raises(TrainwiseError, match=f"{match}.*tensor or a tuple of tensors"):
        trainwise.export(Returns(kind), torch.randn(2, 4), tmp_path / "m.pt2")


def test_tuple_outputs_round_trip(tmp_path):
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 3)

        def forward(self, x, scale):
            y = self.linear(x) * scale
            return y, y.argmax(dim=1)

    model = Two()
    report = trainwise.export(model, (torch.randn(2, 4), torch.rand(2, 1)), tmp_path / "two.torchscript", "torchscript")
    assert [spec["name"] for spec in report.inputs] == ["x", "scale"]
    assert [spec["dtype"] for spec in report.outputs] == ["float32", "int64"]
    logits, labels = _load_own(report.path)(torch.randn(5, 4), torch.rand(5, 1))
    assert logits.shape == (5, 3) and labels.dtype == torch.int64


def test_missing_onnx_is_one_sentence_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx now raises ImportError
    with pytest.raises(TrainwiseError, match=r"needs the onnx package.*pip install trainwise\[onnx\]"):
        trainwise.export(_mlp(), torch.randn(2, 6), tmp_path / "m.onnx", "onnx")
    assert list(tmp_path.iterdir()) == []


def test_loading_onnx_without_onnxruntime_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    artifact = tmp_path / "m.onnx"
    artifact.write_bytes(b"not read: the missing runtime is reported first")
    with pytest.raises(TrainwiseError, match=r"needs the onnxruntime package.*pip install trainwise\[onnx\]"):
        load_exported(artifact)


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_ONNX, reason="onnx or onnxscript absent")
def test_onnx_without_onnxruntime_is_written_but_marked_unverified(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.warns(ExportWarning, match="onnxruntime is not installed"):
        report = trainwise.export(_mlp(), torch.randn(2, 6), tmp_path / "m.onnx", "onnx")
    assert report.path.is_file() and not report.verified and report.max_abs_diff is None
    assert json.loads(report.sidecar.read_text())["parity"]["verified"] is False


def test_unknown_format_and_missing_artifact(tmp_path):
    with pytest.raises(TrainwiseError, match="unknown export format 'tflite'; use one of"):
        trainwise.export(_mlp(), torch.randn(2, 6), tmp_path / "m.bin", "tflite")
    with pytest.raises(TrainwiseError, match="no exported model at"):
        load_exported(tmp_path / "missing.pt2")
    (tmp_path / "weird.bin").write_bytes(b"x")
    with pytest.raises(TrainwiseError, match="cannot tell the format"):
        load_exported(tmp_path / "weird.bin")


def test_trainwise_export_stays_the_function_after_the_module_is_imported(tmp_path):
    import importlib

    importlib.import_module("trainwise.exporting")  # the module is named apart from the function
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExportWarning)
        report = trainwise.export(nn.Linear(3, 2), torch.randn(1, 3), tmp_path / "lin.torchscript", "torchscript")
    assert report.verified and report.batch_sizes == (1, 2, 3)


def test_import_trainwise_stays_torch_free():
    code = "import sys, trainwise; trainwise.__all__; assert 'torch' not in sys.modules, 'torch imported'"
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# -- damaged artifacts and sidecars: one sentence each ---------------------------------------------------------


@pytest.fixture(scope="module")
def small_artifacts(tmp_path_factory):
    """A small MLP exported in every available format: {format: path}."""
    folder = tmp_path_factory.mktemp("small")
    formats = ["torch.export", "torchscript"] + (["onnx"] if HAVE_ONNX else [])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    return {format: trainwise.export(model, torch.randn(2, 6), folder / f"m{SUFFIXES[format]}", format).path
            for format in formats}  # fmt: skip


CORRUPTIONS = {
    "empty": lambda data: b"",
    "truncated": lambda data: data[: len(data) // 2],
    "random-bytes": lambda data: np.random.default_rng(0).bytes(4096),
    "text": lambda data: b"this is not a model\n" * 20,
}


def _damaged(artifacts, format, corruption, folder):
    source = artifacts[format]
    target = folder / source.name
    target.write_bytes(CORRUPTIONS[corruption](source.read_bytes()))
    sidecar = source.with_name(source.name + ".json")
    target.with_name(target.name + ".json").write_bytes(sidecar.read_bytes())
    return target


def _format_params():
    for format in ("torch.export", "torchscript", "onnx"):
        marks = [pytest.mark.skipif(not HAVE_ONNX, reason="onnx absent")] if format == "onnx" else []
        for corruption in CORRUPTIONS:
            yield pytest.param(format, corruption, marks=marks, id=f"{format}-{corruption}")


@pytest.mark.parametrize(("format", "corruption"), list(_format_params()))
def test_damaged_artifacts_are_one_sentence(small_artifacts, format, corruption, tmp_path):
    artifact = _damaged(small_artifacts, format, corruption, tmp_path)
    with pytest.raises(TrainwiseError) as caught:
        _load_own(artifact)  # a damaged TorchScript file, even trusted, is one sentence
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and message.endswith(".")
    assert str(artifact) in message and "export the model again" in message
    if format == "torchscript":  # untrusted, it is refused before anything reads it
        with pytest.raises(TrainwiseError, match="pass trust_code=True"):
            load_exported(artifact)


def _nested(depth: int) -> str:
    return '{"format": "torch.export", "inputs": ' + "[" * depth + "]" * depth + ', "outputs": []}'


SIDECARS = {
    "invalid-json": ('{"format": "torch.export", "inputs": [', "unreadable"),
    "not-utf8": (b"\xff\xfe{}", "unreadable"),
    "top-level-list": ("[1, 2, 3]", "top level is a JSON list"),
    "top-level-string": ('"torch.export"', "top level is a JSON str"),
    "missing-inputs": ('{"format": "torch.export", "outputs": []}', "'inputs' is missing"),
    "unknown-format": ('{"format": "tflite", "inputs": [], "outputs": []}', "format is 'tflite'"),
    "format-not-a-string": ('{"format": ["torch.export"], "inputs": [], "outputs": []}', "format is"),
    "inputs-not-a-list": ('{"format": "torch.export", "inputs": {"x": 1}, "outputs": []}', "inputs must be a list"),
    "spec-not-an-object": ('{"format": "torch.export", "inputs": [7], "outputs": []}', "inputs[0] must be an object"),
    "spec-without-name": (
        '{"format": "torch.export", "inputs": [{"shape": ["batch", 6], "dtype": "float32"}], "outputs": []}',
        "inputs[0].name",
    ),
    "unknown-dtype": (
        '{"format": "torch.export", "inputs": [{"name": "x", "shape": [1], "dtype": "float99"}], "outputs": []}',
        "inputs[0].dtype",
    ),
    "shape-of-strings": (
        '{"format": "torch.export", "inputs": [{"name": "x", "shape": ["a b"], "dtype": "float32"}], "outputs": []}',
        "inputs[0].shape",
    ),
    "negative-size": (
        '{"format": "torch.export", "inputs": [{"name": "x", "shape": [-1], "dtype": "float32"}], "outputs": []}',
        "inputs[0].shape",
    ),
    "single-output-not-bool": ('{"format": "torch.export", "inputs": [], "outputs": [], "single_output": 1}', "true"),
    "deeply-nested": (_nested(100_000), "sidecar"),
    "huge": ('{"format": "torch.export", "inputs": [], "outputs": [], "pad": "' + "x" * (2 << 20) + '"}', "1 MiB"),
    "format-disagrees-with-suffix": ('{"format": "torchscript", "inputs": [], "outputs": []}', "says format"),
}


@pytest.mark.parametrize(("text", "message"), list(SIDECARS.values()), ids=list(SIDECARS))
def test_malformed_sidecar_is_one_sentence(small_artifacts, text, message, tmp_path):
    artifact = tmp_path / "m.pt2"
    artifact.write_bytes(small_artifacts["torch.export"].read_bytes())
    sidecar = artifact.with_name("m.pt2.json")
    sidecar.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(TrainwiseError) as caught:
        load_exported(artifact)
    assert len(str(caught.value).splitlines()) == 1 and message in str(caught.value)
    assert "sidecar" in str(caught.value) and str(caught.value).endswith(".")


def test_a_torchscript_file_named_pt2_loads_only_when_format_says_so(small_artifacts, tmp_path):
    artifact = tmp_path / "m.pt2"
    artifact.write_bytes(small_artifacts["torchscript"].read_bytes())  # a TorchScript program named .pt2
    with pytest.raises(TrainwiseError, match=r"not a readable \.pt2"):
        load_exported(artifact)
    with pytest.raises(TrainwiseError, match="pass trust_code=True"):  # still a program: trust is asked for
        load_exported(artifact, format="torchscript")
    loaded = load_exported(artifact, format="torchscript", trust_code=True)  # the user's choice, trusted
    assert loaded(torch.randn(2, 6)).shape == (2, 3)


class _Marked(torch.Tensor):
    """A trivial tensor subclass: torch.export.save would pickle it (use_pickle), which load_exported refuses."""


def test_tensor_subclass_state_is_refused_at_export_not_at_load(tmp_path):
    class WithSubclass(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("offset", torch.ones(3).as_subclass(_Marked))

        def forward(self, x):
            return x + self.offset

    with pytest.raises(TrainwiseError, match=r"torch.export would pickle offset \(_Marked, not plain tensors\)"):
        trainwise.export(WithSubclass(), torch.randn(2, 3), tmp_path / "m.pt2")
    assert list(tmp_path.iterdir()) == []


# -- operators torch itself writes, and outputs= for models that return fields ----------------------------------


class Masked(nn.Module):
    """``(x > 0) & (x < 1)``, the tensor ``&`` of every attention mask: aten.__and__.Tensor in the graph."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        keep = (x > 0) & (x < 1) | (x < -2)
        return self.linear(x).masked_fill(~keep, 0.0)


def test_a_model_using_tensor_and_round_trips_through_pt2(tmp_path):
    torch.manual_seed(0)
    model = Masked()
    report = trainwise.export(model, torch.randn(3, 4), tmp_path / "masked.pt2")  # refused its own artifact before
    assert report.verified
    import zipfile

    with zipfile.ZipFile(report.path) as archive:
        program = next(archive.read(name) for name in archive.namelist() if name.endswith("models/model.json"))
    assert b"torch.ops.aten.__and__.Tensor" in program and b"torch.ops.aten.__or__.Tensor" in program
    x = torch.randn(6, 4)
    with torch.no_grad():
        torch.testing.assert_close(load_exported(report.path)(x), model(x), **TOL)


class Fields(nn.Module):
    """Returns a dict of tensors, as a model with several heads does."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        features = torch.relu(self.body(x))
        return {"logits": self.head(features), "features": features, "note": "not a tensor"}


@pytest.mark.parametrize("format", ["torch.export", "torchscript"])
def test_outputs_selects_fields_of_a_dict(tmp_path, format):
    torch.manual_seed(0)
    model = Fields()
    x = torch.randn(5, 4)
    with torch.no_grad():
        expected = model(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExportWarning)  # TorchScript traces a field selection (tested below)
        one = trainwise.export(model, torch.randn(2, 4), tmp_path / f"one{SUFFIXES[format]}", format, outputs="logits")
        two = trainwise.export(
            model, torch.randn(2, 4), tmp_path / f"two{SUFFIXES[format]}", format, outputs=("features", "logits")
        )
    assert [spec["name"] for spec in one.outputs] == ["logits"] and one.outputs[0]["shape"] == ["batch", 3]
    assert [spec["name"] for spec in two.outputs] == ["features", "logits"]
    torch.testing.assert_close(_load_own(one.path)(x), expected["logits"], **TOL)  # the tensor itself
    features, logits = _load_own(two.path)(x)
    torch.testing.assert_close(features, expected["features"], **TOL)
    torch.testing.assert_close(logits, expected["logits"], **TOL)
    assert json.loads(one.sidecar.read_text())["single_output"] is True


def test_torchscript_says_that_outputs_is_traced(tmp_path):
    with pytest.warns(ExportWarning, match="outputs= is exported by tracing.*traced instead"):
        report = trainwise.export(Fields(), torch.randn(2, 4), tmp_path / "f.torchscript", "torchscript",
                                  outputs="logits")  # fmt: skip
    assert report.method == "trace"


def test_a_dict_output_without_outputs_names_the_fix(tmp_path):
    with pytest.raises(TrainwiseError) as info:
        trainwise.export(Fields(), torch.randn(2, 4), tmp_path / "f.pt2")
    message = str(info.value)
    assert "the model returns a dict with the tensor fields logits, features" in message
    assert "pass outputs='logits' to export that field (or several names" in message and "\n" not in message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("model", "outputs", "match"),
    [
        (Fields(), "logit", r"the model's dict has no field 'logit'; pass outputs= one of 'logits', 'features'\."),
        (Fields(), "note", r"the model's dict has a str, not a tensor, as 'note'; pass outputs= one of 'logits'"),
        (nn.Linear(4, 3), "logits", r"but the model returns a Tensor; drop outputs="),
        (Fields(), 3, r"outputs must name the fields to export, e.g. outputs='logits' \(or a tuple of names\), got 3"),
        (Fields(), (), r"outputs must name the fields"),
        (Fields(), ("logits", "logits"), r"outputs names 'logits' more than once"),
    ],
    ids=["missing", "not-a-tensor", "plain-tensor", "int", "empty", "twice"],
)
def test_outputs_mistakes_are_one_sentence(tmp_path, model, outputs, match):
    with pytest.raises(TrainwiseError, match=match) as info:
        trainwise.export(model, torch.randn(2, 4), tmp_path / "m.pt2", outputs=outputs)
    assert "\n" not in str(info.value) and "fails on the example inputs" not in str(info.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        ("ImageClassifierOutput", "an ImageClassifierOutput"),
        ("SequenceClassifierOutput", "a SequenceClassifierOutput"),
        ("dict", "a dict"),
        ("int", "an int"),
        ("OrderedDict", "an OrderedDict"),
        ("MLP", "an MLP"),
        ("LSTM", "an LSTM"),
        ("CNN", "a CNN"),
        ("UnionType", "a UnionType"),
        ("UserDict", "a UserDict"),
        ("Tensor", "a Tensor"),
        ("NoneType", "a NoneType"),
    ],
)
def test_the_article_follows_the_sound_of_the_word(word, expected):
    from trainwise.errors import with_article as _a

    assert _a(word) == expected


def test_a_forward_taking_star_args_exports_with_a_dynamic_batch(tmp_path):
    class Sum(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(3, 2)

        def forward(self, *inputs):
            return self.linear(sum(inputs))

    model = Sum()
    report = trainwise.export(model, (torch.randn(2, 3), torch.randn(2, 3)), tmp_path / "sum.pt2")
    assert report.dynamic_batch and report.batch_sizes == (2, 1, 3)
    a, b = torch.randn(7, 3), torch.randn(7, 3)
    with torch.no_grad():
        torch.testing.assert_close(load_exported(report.path)(a, b), model(a, b), **TOL)


def test_an_operator_of_another_library_is_refused_at_export_with_what_works(tmp_path):
    @torch.library.custom_op("trainwise_test_export::double", mutates_args=())
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @double.register_fake
    def _(x):
        return torch.empty_like(x)

    class Doubled(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(3, 3)

        def forward(self, x):
            return torch.ops.trainwise_test_export.double(self.linear(x))

    with pytest.raises(TrainwiseError) as info:
        trainwise.export(Doubled(), torch.randn(2, 3), tmp_path / "d.pt2")
    message = str(info.value)
    assert "the library 'trainwise_test_export', not of torch's own aten or prims" in message
    assert "use format='torchscript'" in message and "export the model again" not in message and "\n" not in message
    assert list(tmp_path.iterdir()) == []
    report = trainwise.export(Doubled(), torch.randn(2, 3), tmp_path / "d.torchscript", "torchscript")
    assert report.verified and report.method == "script"  # what the sentence advises does work


def test_first_line_quotes_an_error_in_one_line_at_its_limit():
    from trainwise.errors import first_line

    assert first_line(ValueError("\n  bad shape.\nmore detail")) == "bad shape"
    assert first_line(ValueError("")) == "ValueError" and len(first_line(ValueError("x" * 999), 200)) == 200
