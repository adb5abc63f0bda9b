"""``trainwise export`` and ``trainwise predict``: artifacts from checkpoints, outputs printed or saved atomically."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

import trainwise
from trainwise.cli import main
from trainwise.demo import make_model
from trainwise.evaluation import evaluating
from trainwise.exporting import load_exported


@pytest.fixture(scope="module")
def demo_artifact(tmp_path_factory):
    """The demo CNN with weights saved the way DataParallel would (``module.`` prefix, under ``model``)."""
    folder = tmp_path_factory.mktemp("cli-export")
    torch.manual_seed(3)
    model = make_model()
    with torch.no_grad():
        model(torch.rand(32, 1, 8, 8))  # running statistics that differ from a fresh model's
    checkpoint = folder / "ckpt.pt"
    torch.save({"model": {f"module.{k}": v for k, v in model.state_dict().items()}, "epoch": 3}, checkpoint)
    return model, checkpoint


def test_export_checkpoint_with_demo_model_json(demo_artifact, capsys):
    model, checkpoint = demo_artifact
    assert main(["export", str(checkpoint), "--demo", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    artifact = checkpoint.with_suffix(".pt2")
    assert report["path"] == str(artifact) and report["verified"] and report["format"] == "torch.export"
    assert report["inputs"][0]["shape"] == ["batch", 1, 8, 8]
    x = torch.rand(6, 1, 8, 8)
    with evaluating(model):
        expected = model(x)
    torch.testing.assert_close(load_exported(artifact)(x), expected)  # the checkpoint's weights, not fresh ones


def test_export_with_model_factory_and_format(demo_artifact, tmp_path, capsys):
    _, checkpoint = demo_artifact
    out = tmp_path / "net.torchscript"
    args = ["export", str(checkpoint), "--model", "trainwise.demo:make_model", "--example-shape", "2,1,8,8"]
    assert main([*args, "--format", "torchscript", "--output", str(out)]) == 0
    line = capsys.readouterr().out
    assert "torchscript, scripted" in line and "max abs diff" in line and out.is_file()
    assert json.loads(out.with_name(out.name + ".json").read_text())["format"] == "torchscript"


def test_export_demo_without_checkpoint_writes_to_cwd(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["export", "--demo", "--format", "torchscript"]) == 0
    captured = capsys.readouterr()
    assert "freshly initialised weights" in captured.err
    assert (tmp_path / "digits-cnn.torchscript").is_file() and (tmp_path / "digits-cnn.torchscript.json").is_file()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["export"], "--model package.module:factory (or --demo"),
        (["export", "--demo", "--model", "trainwise.demo:make_model"], "either --model or --demo"),
        (["export", "--model", "trainwise.demo:make_model"], "pass --example-shape"),
        (["export", "--demo", "--example-shape", "1,x"], "is not a shape"),
        (["export", "--demo", "--example-shape", "1,3,8,8"], "fails on the example inputs"),
        (["export", "missing.pt", "--demo"], "checkpoint missing.pt does not exist"),
        (["export", "--model", "no_such_module:f", "--example-shape", "1,4"], "no module named 'no_such_module'"),
        (["export", "--demo", "--model-kwargs", "[1]"], "must be a JSON object"),
        (["export", "--demo", "--model-kwargs", '{"depth": 3}'], "cannot be called with --model-kwargs"),
    ],
    ids=["no-model", "both", "no-shape", "bad-shape", "wrong-shape", "no-checkpoint", "no-module", "kwargs", "kwarg"],
)
def test_export_user_errors_exit_2(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())


def test_export_checkpoint_that_does_not_fit_exits_2(demo_artifact, capsys):
    _, checkpoint = demo_artifact
    argv = ["export", str(checkpoint), "--demo", "--model-kwargs", '{"width": 8}', "-o", "unused.pt2"]
    assert main(argv) == 2
    assert "shape" in capsys.readouterr().err


@pytest.fixture(scope="module")
def artifact(demo_artifact):
    _, checkpoint = demo_artifact
    path = checkpoint.with_name("predict.torchscript")
    assert main(["export", str(checkpoint), "--demo", "--format", "torchscript", "-o", str(path), "--json"]) == 0
    return path  # a TorchScript program: predict runs it only with --trust-code (its bytes are this test's own)


def test_predict_prints_outputs_and_argmax(artifact, tmp_path, capsys):
    x = np.random.default_rng(0).random((3, 1, 8, 8))  # float64, as numpy makes it: cast to the artifact's float32
    np.save(tmp_path / "x.npy", x)
    assert main(["predict", str(artifact), str(tmp_path / "x.npy")]) == 2  # refused: a program, not trusted
    assert "--trust-code" in capsys.readouterr().err
    assert main(["predict", str(artifact), str(tmp_path / "x.npy"), "--trust-code"]) == 0
    out = capsys.readouterr().out
    expected = load_exported(artifact, trust_code=True)(torch.from_numpy(x).float()).numpy()
    assert "output: shape [3, 10] float32" in out
    assert f"output argmax: {np.array2string(expected.argmax(axis=1))}" in out
    assert main(["predict", str(artifact), str(tmp_path / "x.npy"), "--json", "--trust-code"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    np.testing.assert_allclose(np.array(summary["outputs"]["output"]), expected, rtol=1e-6, atol=1e-6)
    assert summary["argmax"]["output"] == expected.argmax(axis=1).tolist()


def test_predict_saves_atomically_and_keeps_a_good_file_on_error(artifact, tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.ones((2, 1, 8, 8), dtype=np.float32))
    np.save(tmp_path / "bad.npy", np.ones((1, 8, 8), dtype=np.float32))
    out = tmp_path / "out.npy"
    assert main(["predict", str(artifact), str(tmp_path / "x.npy"), "--output", str(out), "--trust-code"]) == 0
    saved = np.load(out)
    assert saved.shape == (2, 10)
    assert main(["predict", str(artifact), str(tmp_path / "bad.npy"), "--output", str(out), "--trust-code"]) == 2
    assert "add the batch dimension" in capsys.readouterr().err
    np.testing.assert_array_equal(np.load(out), saved)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.npy", "out.npy", "x.npy"]  # no temporary left
    argv = ["predict", str(artifact), str(tmp_path / "x.npy"), "--output", str(tmp_path / "out.txt"), "--trust-code"]
    assert main(argv) == 2
    assert "must end in .npy" in capsys.readouterr().err


@pytest.mark.slow
def test_predict_missing_files_exit_2_without_traceback(artifact, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "trainwise.cli", "predict", str(artifact), str(tmp_path / "none.npy"), "--trust-code"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "input file" in proc.stderr and "does not exist" in proc.stderr
    assert main(["predict", str(tmp_path / "none.pt2"), str(tmp_path / "none.npy")]) == 2


# -- damaged artifacts, sidecars and input files: one line on stderr, exit 2 -----------------------------------


class _Touch:
    """Pickles as ``pathlib.Path(marker).touch()``: what an object array in a .npy could run when unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A small MLP as .pt2 and .torchscript (and .onnx when available), and a matching input batch."""
    folder = tmp_path_factory.mktemp("predict-small")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    formats = ["torch.export", "torchscript"] + (["onnx"] if _have_onnx() else [])
    suffixes = {"torch.export": ".pt2", "torchscript": ".torchscript", "onnx": ".onnx"}
    paths = {f: trainwise.export(model, torch.randn(2, 6), folder / f"m{suffixes[f]}", f).path for f in formats}
    batch = folder / "x.npy"
    np.save(batch, np.ones((2, 6), dtype=np.float32))
    return paths, batch


def _have_onnx() -> bool:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        return False
    return True


def _one_line_error(capfd) -> str:
    captured = capfd.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


@pytest.mark.parametrize("format", ["torch.export", "torchscript", "onnx"])
@pytest.mark.parametrize("damage", ["empty", "truncated", "random-bytes"])
def test_predict_damaged_artifact_exits_2_with_one_line(small, format, damage, tmp_path, capfd):
    paths, batch = small
    if format not in paths:
        pytest.skip("onnx, onnxscript or onnxruntime absent")
    data = paths[format].read_bytes()
    bad = {"empty": b"", "truncated": data[: len(data) // 2], "random-bytes": np.random.default_rng(1).bytes(3000)}
    artifact = tmp_path / paths[format].name
    artifact.write_bytes(bad[damage])
    trust = ["--trust-code"] if format == "torchscript" else []  # trusted, a damaged program is still one line
    assert main(["predict", str(artifact), str(batch), *trust]) == 2
    line = _one_line_error(capfd)
    assert line.startswith("trainwise predict: error: ") and "not a readable" in line
    if format == "torchscript":  # untrusted, it is refused before torch reads it
        assert main(["predict", str(artifact), str(batch)]) == 2
        assert "pass --trust-code" in _one_line_error(capfd)


def _save_input(kind: str, path: pathlib.Path, marker: pathlib.Path) -> pathlib.Path:
    if kind == "pickled-object-array":
        np.save(path, np.array([_Touch(marker)], dtype=object), allow_pickle=True)
    elif kind == "npz-with-pickled-member":
        path = path.with_suffix(".npz")
        np.savez(path, x=np.array([_Touch(marker)], dtype=object))
    elif kind == "empty-file":
        path.write_bytes(b"")
    elif kind == "random-bytes":
        path.write_bytes(np.random.default_rng(2).bytes(500))
    elif kind == "truncated":
        np.save(path, np.ones((2, 6), dtype=np.float32))
        path.write_bytes(path.read_bytes()[:100])
    elif kind == "strings":
        np.save(path, np.array([["a"] * 6] * 2))
    elif kind == "structured":
        np.save(path, np.zeros(2, dtype=[("a", "f4"), ("b", "i4")]))
    elif kind == "empty-npz":
        path = path.with_suffix(".npz")
        np.savez(path)
    return path


INPUTS = [
    "pickled-object-array",
    "npz-with-pickled-member",
    "empty-file",
    "random-bytes",
    "truncated",
    "strings",
    "structured",
    "empty-npz",
]


@pytest.mark.parametrize("kind", INPUTS)
def test_predict_bad_input_file_exits_2_without_unpickling(small, kind, tmp_path, capfd):
    paths, _ = small
    marker = tmp_path / "unpickled.marker"
    batch = _save_input(kind, tmp_path / "x.npy", marker)
    assert main(["predict", str(paths["torch.export"]), str(batch)]) == 2
    line = _one_line_error(capfd)
    assert str(batch) in line and line.endswith(".")
    assert not marker.exists()


def test_predict_wrong_shape_without_sidecar_is_one_line(small, tmp_path, capfd):
    paths, _ = small
    artifact = tmp_path / "bare.pt2"
    artifact.write_bytes(paths["torch.export"].read_bytes())  # no sidecar: the runtime itself meets the shape
    np.save(tmp_path / "x.npy", np.ones((2, 5), dtype=np.float32))
    assert main(["predict", str(artifact), str(tmp_path / "x.npy")]) == 2
    assert "check the array's shape and dtype" in _one_line_error(capfd)


@pytest.mark.parametrize(
    "text",
    ["[1, 2]", "{", '{"format": "torch.export", "inputs": "x", "outputs": []}', '{"format": "onnx", "inputs": []}'],
    ids=["not-an-object", "invalid-json", "wrong-type", "missing-key"],
)
def test_predict_malformed_sidecar_exits_2_with_one_line(small, text, tmp_path, capfd):
    paths, batch = small
    artifact = tmp_path / "m.pt2"
    artifact.write_bytes(paths["torch.export"].read_bytes())
    (tmp_path / "m.pt2.json").write_text(text)
    assert main(["predict", str(artifact), str(batch)]) == 2
    assert "sidecar" in _one_line_error(capfd)


# -- where export writes by default, and what it never overwrites (issue 16) -----------------------------------


def test_export_of_a_run_checkpoint_writes_beside_the_run_folder(demo_artifact, tmp_path, capsys):
    _, checkpoint = demo_artifact
    folder = tmp_path / "runs" / "exp" / "checkpoints"
    folder.mkdir(parents=True)
    inside = folder / "ckpt-step000000010.pt"
    inside.write_bytes(checkpoint.read_bytes())
    assert main(["export", str(inside), "--demo", "--format", "torchscript", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["path"] == str(tmp_path / "runs" / "exp" / "model.torchscript")
    assert sorted(p.name for p in folder.iterdir()) == ["ckpt-step000000010.pt"]  # nothing added to checkpoints/


def test_export_never_replaces_the_checkpoint_it_reads(demo_artifact, tmp_path, capsys):
    _, checkpoint = demo_artifact
    renamed = tmp_path / "weights.pt2"  # a checkpoint renamed .pt2: the default output must not be itself
    renamed.write_bytes(checkpoint.read_bytes())
    before = renamed.read_bytes()
    assert main(["export", str(renamed), "--demo", "-o", str(renamed)]) == 2
    line = _one_line_error(capsys)
    assert "is the checkpoint being exported" in line and "choose another path" in line
    assert main(["export", str(renamed), "--demo", "--format", "torchscript"]) == 0
    capsys.readouterr()
    assert renamed.read_bytes() == before
    assert main(["export", str(renamed), "--demo", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["path"] == str(tmp_path / "weights-exported.pt2")
    assert renamed.read_bytes() == before


def test_export_with_weights_of_another_model_is_one_sentence(demo_artifact, tmp_path, capsys):
    _, checkpoint = demo_artifact
    argv = ["export", str(checkpoint), "--model", "torch.nn:Linear", "--model-kwargs", '{"in_features": 64, '
            '"out_features": 10}', "--example-shape", "1,64", "-o", str(tmp_path / "x.pt2")]
    assert main(argv) == 2
    line = _one_line_error(capsys)
    assert "do not fit the model of torch.nn:Linear" in line and "--model and --model-kwargs" in line
    assert "strict=False" not in line and not any(tmp_path.iterdir())


def test_a_failed_torch_export_prints_one_line(tmp_path, monkeypatch, capfd):
    (tmp_path / "branchy.py").write_text(
        "import torch\n\n"
        "class Branchy(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.linear = torch.nn.Linear(3, 2)\n\n"
        "    def forward(self, x):\n"
        "        if x.sum() > 0:\n"
        "            return self.linear(x)\n"
        "        return -self.linear(x)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["export", "--model", "branchy:Branchy", "--example-shape", "2,3", "-o", "b.pt2"]) == 2
    line = _one_line_error(capfd)  # torch prints its partial graph to stderr: held back
    assert "data-dependent control flow" in line and "--format torchscript" in line and "format=" not in line
    assert not (tmp_path / "b.pt2").exists()


def test_predict_on_a_checkpoint_names_the_export_command(demo_artifact, tmp_path, capfd):
    _, checkpoint = demo_artifact
    np.save(tmp_path / "x.npy", np.ones((2, 1, 8, 8), dtype=np.float32))
    for name, extra in (("weights.pt2", []), ("weights.pt", ["--format", "torch.export"])):
        target = tmp_path / name
        target.write_bytes(checkpoint.read_bytes())
        assert main(["predict", str(target), str(tmp_path / "x.npy"), *extra]) == 2
        line = _one_line_error(capfd)
        assert "is a checkpoint saved with torch.save, not an exported model" in line
        assert f"`trainwise export {target} --demo`" in line  # the demo CNN's names and shapes: --demo
        assert "then run `trainwise predict" in line and "format=" not in line


def test_export_outputs_selects_fields_and_the_refusal_names_the_flag(tmp_path, monkeypatch, capfd):
    (tmp_path / "heads.py").write_text(
        "import torch\n\n"
        "class Heads(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.body = torch.nn.Linear(4, 6)\n"
        "        self.head = torch.nn.Linear(6, 3)\n\n"
        "    def forward(self, x):\n"
        "        features = self.body(x)\n"
        "        return {'logits': self.head(features), 'features': features}\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["export", "--model", "heads:Heads", "--example-shape", "2,4", "-o", "h.pt2"]
    assert main(argv) == 2
    line = _one_line_error(capfd)
    assert "returns a dict with the tensor fields logits, features" in line
    assert "pass --outputs logits to export that field" in line and "outputs=" not in line
    assert main([*argv, "--outputs", "logits,"]) == 2
    assert "has an empty name" in _one_line_error(capfd)
    assert main([*argv, "--outputs", "features,logits", "--json"]) == 0
    report = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    assert [spec["name"] for spec in report["outputs"]] == ["features", "logits"]
    np.save(tmp_path / "x.npy", np.ones((3, 4), dtype=np.float32))
    assert main(["predict", "h.pt2", "x.npy", "--output", "out.npz"]) == 0
    with np.load(tmp_path / "out.npz") as saved:
        assert sorted(saved.files) == ["features", "logits"] and saved["logits"].shape == (3, 3)


def test_an_example_that_would_not_fit_in_memory_is_one_sentence(tmp_path, monkeypatch, capfd):
    """Before (issue 48, item 10): ``--example-shape 100000,100000,100000`` ended in torch's allocator
    traceback (it tried to allocate 4 PB for the example)."""
    monkeypatch.chdir(tmp_path)
    argv = ["export", "--model", "trainwise.demo:make_model", "--example-shape"]
    assert main([*argv, "100000,100000,100000"]) == 2
    line = _one_line_error(capfd)
    assert line.startswith("trainwise export: error: --example-shape 100000,100000,100000 makes a float32 example "
                           "of 3.6 PiB, more than the ")
    assert line.endswith(" of memory available here; pass a smaller --example-shape.")
    assert main([*argv, "1000000000,1000,1000", "--example-dtype", "int64"]) == 2
    line = _one_line_error(capfd)
    assert "makes an int64 example of 7.1 PiB" in line
    assert line.endswith("; pass the shape of one small batch, such as 1,1000,1000 (the batch dimension stays free "
                         "in the artifact).")
    assert not any(tmp_path.iterdir())


def test_an_output_without_a_suffix_never_replaces_an_unrelated_file_with_its_sidecar(tmp_path, monkeypatch, capfd):
    """Before (issue 48, item 10): ``--output model`` wrote the sidecar to ``model.json``, silently replacing
    the user's own file of that name."""
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "model.json"
    mine.write_text('{"layers": 4, "note": "my own model config"}\n')
    before = mine.read_bytes()
    assert main(["export", "--demo", "--output", "model"]) == 2
    assert _one_line_error(capfd) == (
        "trainwise export: error: the sidecar of model would be model.json, which exists and is not a sidecar "
        "trainwise export wrote; give the artifact a suffix, such as model.pt2, or move model.json away.")
    assert mine.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["model.json"]
    mine.unlink()
    for _ in range(2):  # the sidecar an export wrote is its own: the next export replaces it
        assert main(["export", "--demo", "--output", "model"]) == 0
        capfd.readouterr()
    assert json.loads(mine.read_text())["artifact"] == "model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "model.json"]
