"""``trainwise ckpt inspect`` and ``convert``; every bad input is one line, exit code 2, and touches no file."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from ckpt_helpers import Net, make_bad_inputs

from trainwise import load_weights
from trainwise.checkpoint import CheckpointManager
from trainwise.cli import main


def digest(folder) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.fixture
def ddp_file(tmp_path, net):
    path = tmp_path / "ddp.pt"
    torch.save({"model": {"module." + k: v for k, v in net.state_dict().items()}, "epoch": 4}, path)
    return path


def test_inspect_json_reports_prefixes_and_tensors(ddp_file, capsys):
    assert main(["ckpt", "inspect", str(ddp_file), "--format", "json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "torch-zip" and info["prefixes"] == ["module."]
    assert info["weights_at"] == "['model']" and "weights" in info["holds"] and "epoch=4" in info["holds"]
    assert info["tensor_count"] == 9 and info["parameters"] == sum(v.numel() for v in Net().state_dict().values())
    assert info["dtypes"] == {"float32": 8, "int64": 1}
    assert {"name": "module.encoder.weight", "shape": [8, 4], "dtype": "float32"} in info["tensors"]


def test_inspect_table_of_a_trainwise_checkpoint(tmp_path, net, capsys):
    optimizer = torch.optim.AdamW(net.parameters())
    path = CheckpointManager(tmp_path, keep_last=1).save(
        {"model": torch.compile(net), "optimizer": optimizer, "step": 12}, step=12, config={"lr": 1e-3}
    )
    assert main(["ckpt", "inspect", str(path)]) == 0
    out = capsys.readouterr().out
    for text in ("trainwise training checkpoint", "optimizer", "RNG states", "step=12", "config",
                 "encoder.weight", "(8, 4)", "float32", "none"):
        assert text in out, text


@pytest.mark.parametrize(
    "kind, prefix, out_name",
    [("ddp", "module.", "clean.safetensors"), ("compile", "_orig_mod.", "clean.pt"),
     ("lightning", "model.", "clean.pth")],
)
def test_convert_strips_wrapper_prefixes(tmp_path, net, capsys, kind, prefix, out_name):
    sd = {prefix + k: v for k, v in net.state_dict().items()}
    content = {"state_dict": sd, "pytorch-lightning_version": "2.4.0", "epoch": 1} if kind == "lightning" else sd
    source = tmp_path / "in.ckpt"
    torch.save(content, source)
    out = tmp_path / out_name
    assert main(["ckpt", "convert", str(source), str(out)]) == 0
    assert f"removed prefix {prefix!r}" in capsys.readouterr().out
    if out.suffix == ".safetensors":
        from safetensors.torch import load_file

        loaded = load_file(out)
    else:
        loaded = torch.load(out, weights_only=True)
    assert set(loaded) == set(net.state_dict())
    torch.manual_seed(9)
    target = Net()
    report = load_weights(target, out)
    assert report.ok and report.prefix_changes == []
    assert all(torch.equal(a, b) for a, b in zip(target.state_dict().values(), net.state_dict().values()))


def test_convert_keeps_a_model_prefix_outside_lightning(tmp_path, net, capsys):
    # "model." is only a wrapper in a Lightning checkpoint; elsewhere it may be a real attribute name
    source = tmp_path / "in.pt"
    torch.save({"model." + k: v for k, v in net.state_dict().items()}, source)
    assert main(["ckpt", "convert", str(source), str(tmp_path / "out.pt")]) == 0
    assert all(k.startswith("model.") for k in torch.load(tmp_path / "out.pt", weights_only=True))


def test_convert_refuses_to_overwrite_and_bad_suffix(tmp_path, ddp_file, capsys):
    out = tmp_path / "out.safetensors"
    out.write_bytes(b"precious")
    assert main(["ckpt", "convert", str(ddp_file), str(out)]) == 2
    assert "--force" in capsys.readouterr().err and out.read_bytes() == b"precious"
    assert main(["ckpt", "convert", str(ddp_file), str(out), "--force"]) == 0
    assert out.read_bytes() != b"precious"
    assert main(["ckpt", "convert", str(ddp_file), str(tmp_path / "out.onnx")]) == 2
    assert "must end in .safetensors" in capsys.readouterr().err
    assert main(["ckpt", "convert", str(ddp_file), str(tmp_path / "no" / "out.pt")]) == 2


def test_convert_of_a_file_without_weights(tmp_path, capsys):
    path = tmp_path / "opt.pt"
    torch.save({"optimizer": {"state": {}, "param_groups": []}}, path)
    assert main(["ckpt", "convert", str(path), str(tmp_path / "o.pt")]) == 2
    assert "no model weights" in capsys.readouterr().err


BAD = ["zero-byte", "truncated", "random", "json", "plain-pickle", "truncated-safetensors", "directory", "missing"]


@pytest.mark.parametrize("kind", BAD)
def test_bad_inputs_exit_2_with_one_line_and_touch_nothing(tmp_path, net, capsys, kind):
    run_dir = tmp_path / "run"
    good = CheckpointManager(run_dir, keep_last=2).save({"model": net}, step=1)
    out = tmp_path / "existing.safetensors"
    out.write_bytes(b"an existing good file")
    files = make_bad_inputs(tmp_path / "bad", good)
    before = digest(tmp_path)
    for argv in (
        ["ckpt", "inspect", str(files[kind])],
        ["ckpt", "inspect", str(files[kind]), "--format", "json"],
        ["ckpt", "convert", str(files[kind]), str(out), "--force"],
        ["ckpt", "convert", str(files[kind]), str(tmp_path / "new.pt")],
    ):
        assert main(argv) == 2, argv
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("trainwise ckpt: error: "), captured.err
        assert "Traceback" not in captured.err and captured.out == ""
    assert digest(tmp_path) == before  # nothing overwritten, deleted or created
    assert CheckpointManager(run_dir).latest() == good


def test_ckpt_without_action_prints_help(capsys):
    assert main(["ckpt"]) == 2
    assert "inspect" in capsys.readouterr().out

