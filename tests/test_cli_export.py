"""``trainwise export`` and ``trainwise predict``: artifacts from checkpoints, outputs printed or saved atomically."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

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
    return path


def test_predict_prints_outputs_and_argmax(artifact, tmp_path, capsys):
    x = np.random.default_rng(0).random((3, 1, 8, 8))  # float64, as numpy makes it: cast to the artifact's float32
    np.save(tmp_path / "x.npy", x)
    assert main(["predict", str(artifact), str(tmp_path / "x.npy")]) == 0
    out = capsys.readouterr().out
    expected = load_exported(artifact)(torch.from_numpy(x).float()).numpy()
    assert "output: shape [3, 10] float32" in out
    assert f"output argmax: {np.array2string(expected.argmax(axis=1))}" in out
    assert main(["predict", str(artifact), str(tmp_path / "x.npy"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    np.testing.assert_allclose(np.array(summary["outputs"]["output"]), expected, rtol=1e-6, atol=1e-6)
    assert summary["argmax"]["output"] == expected.argmax(axis=1).tolist()


def test_predict_saves_atomically_and_keeps_a_good_file_on_error(artifact, tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.ones((2, 1, 8, 8), dtype=np.float32))
    np.save(tmp_path / "bad.npy", np.ones((1, 8, 8), dtype=np.float32))
    out = tmp_path / "out.npy"
    assert main(["predict", str(artifact), str(tmp_path / "x.npy"), "--output", str(out)]) == 0
    saved = np.load(out)
    assert saved.shape == (2, 10)
    assert main(["predict", str(artifact), str(tmp_path / "bad.npy"), "--output", str(out)]) == 2
    assert "add the batch dimension" in capsys.readouterr().err
    np.testing.assert_array_equal(np.load(out), saved)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.npy", "out.npy", "x.npy"]  # no temporary left
    assert main(["predict", str(artifact), str(tmp_path / "x.npy"), "--output", str(tmp_path / "out.txt")]) == 2
    assert "must end in .npy" in capsys.readouterr().err


def test_predict_missing_files_exit_2_without_traceback(artifact, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "trainwise.cli", "predict", str(artifact), str(tmp_path / "none.npy")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "input file" in proc.stderr and "does not exist" in proc.stderr
    assert main(["predict", str(tmp_path / "none.pt2"), str(tmp_path / "none.npy")]) == 2
