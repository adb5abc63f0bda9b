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


def test_ckpt_without_action_is_one_line(capsys):
    assert main(["ckpt"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert "trainwise ckpt inspect FILE" in captured.err and "trainwise ckpt convert IN OUT" in captured.err


# -- a Trainer checkpoint: epoch, step and the logged metrics (issue 16 item 5) ------------------------------


@pytest.fixture(scope="module")
def trainer_checkpoint(tmp_path_factory):
    """A real Trainer run of two epochs on a tiny dataset: its newest checkpoint, and the run's history."""
    from torch.utils.data import TensorDataset

    from trainwise import Trainer

    x = torch.randn(24, 4, generator=torch.Generator().manual_seed(0))
    data = TensorDataset(x, (x[:, 0] > 0).long())
    run_dir = tmp_path_factory.mktemp("trainer-ckpt") / "run"
    result = Trainer(epochs=2, batch_size=8, run_dir=str(run_dir), progress="off", plot=False).fit(
        lambda: torch.nn.Linear(4, 2), data, data
    )
    return CheckpointManager(run_dir).latest(), result


def test_inspect_shows_epoch_step_and_logged_metrics(trainer_checkpoint, capsys):
    path, result = trainer_checkpoint
    code, out, err = run_cli(capsys, "inspect", path, "--format", "json")
    assert code == 0 and err == "", err
    training = json.loads(out)["training"]
    assert training["epoch"] == 2 and training["epoch_finished"] and training["epochs"] == 2
    assert training["step"] == result.steps == 6
    assert [row["epoch"] for row in training["metrics"]] == [1, 2]
    assert training["metrics"][-1]["val_loss"] == pytest.approx(result.history[-1]["val_loss"])
    assert training["monitor"] == "val_loss" and isinstance(training["metric"], float)
    code, out, err = run_cli(capsys, "inspect", path)
    assert code == 0 and err == "", err
    assert "2 of 2, finished" in out and "6 optimizer steps" in out and "logged metrics" in out
    last = result.history[-1]
    assert "epoch 2 (step 6, " in out and f"val_loss {last['val_loss']:.4f}" in out and "lr 1.0e-03" in out


def test_inspect_of_a_mid_epoch_and_a_hostile_loop(tmp_path, net, capsys):
    state = {
        "model": net.state_dict(),
        "loader": {"epoch_start": {}, "batches_done": 5},
        "loop": {"epoch": 3, "history": [
            {"epoch": 1, "val_loss": 0.5, "\x1b[2Jname": 1.0, "huge": 2**2000, "nan": float("nan"), "t": torch.ones(2)},
            "not a mapping", {"epoch": 2, "val_loss": 0.25},
        ]},
    }
    path = tmp_path / "mid.pt"
    torch.save({"trainwise_checkpoint": 1, "meta": {"step": 17}, "state": state, "rng": None}, path)
    code, out, err = run_cli(capsys, "inspect", path, "--format", "json")
    assert code == 0 and err == "", err
    training = json.loads(out)["training"]
    assert training["epoch"] == 3 and not training["epoch_finished"] and training["batches_done"] == 5
    assert training["step"] == 17
    assert training["metrics"] == [{"epoch": 1, "val_loss": 0.5, "\\x1b[2Jname": 1.0}, {"epoch": 2, "val_loss": 0.25}]
    code, out, err = run_cli(capsys, "inspect", path)
    assert code == 0 and err == "", err
    assert "3, in progress (5 batches done)" in out and "17 optimizer steps" in out
    assert "\x1b" not in out and "val_loss 0.2500" in out



# -- files whose name lies, tensors without data, hostile content (issue 10 item 9) ---------------------


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(["ckpt", *map(str, argv)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_error_line(code: int, out: str, err: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("trainwise ckpt: error: "), (code, err)
    assert "Traceback" not in err and out == ""
    return lines[0]


def test_a_torch_file_named_safetensors(tmp_path, net, capsys):
    path = tmp_path / "weights.safetensors"
    torch.save(net.state_dict(), path)
    code, out, err = run_cli(capsys, "inspect", path)
    assert code == 0 and "torch-zip" in out and "named .safetensors" in " ".join(out.split()), out + err
    code, out, err = run_cli(capsys, "inspect", path, "--format", "json")
    assert code == 0 and json.loads(out)["format"] == "torch-zip"
    assert "named .safetensors" in json.loads(out)["note"]
    code, out, err = run_cli(capsys, "convert", path, tmp_path / "real.safetensors")
    assert code == 0 and "Traceback" not in err
    from safetensors.torch import load_file

    assert set(load_file(tmp_path / "real.safetensors")) == set(net.state_dict())


def test_a_safetensors_file_named_pt(tmp_path, net, capsys):
    from trainwise.checkpoint.weights import safetensors_bytes

    path = tmp_path / "weights.pt"
    path.write_bytes(safetensors_bytes(net.state_dict()))
    code, out, err = run_cli(capsys, "inspect", path)
    assert code == 0 and "safetensors" in out and "named .pt" in " ".join(out.split()), out + err


@pytest.mark.parametrize("kind", ["meta", "coo", "csr"])
def test_convert_refuses_tensors_without_data_and_sparse_tensors(tmp_path, net, capsys, kind):
    sd = net.state_dict()
    weight = sd["head.weight"]
    sd["head.weight"] = {"meta": lambda: torch.empty(weight.shape, device="meta"),
                         "coo": lambda: weight.to_sparse(), "csr": lambda: weight.to_sparse_csr()}[kind]()
    source = tmp_path / "in.pt"
    torch.save(sd, source)
    code, out, _ = run_cli(capsys, "inspect", source)
    assert code == 0 and "head.weight" in out
    out_file = tmp_path / "out.safetensors"
    line = assert_one_error_line(*run_cli(capsys, "convert", source, out_file))
    assert "'head.weight'" in line
    assert ("meta" in line and "no data" in line) if kind == "meta" else ".to_dense()" in line
    assert not out_file.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["in.pt"]


def hostile_checkpoint(path, net) -> None:
    deep: list = []
    for _ in range(50):
        deep = [deep]
    meta = {
        "trainwise": "\x1b[2J\x1b[31mHACKED\x07",
        "torch": "x" * 100_000,
        "python": "[/bold][red]markup",
        5: "a non-string key",
        "config": {"nested": deep, 7: torch.ones(3), "s": "\x1b]0;title\x07"},
    }
    # 2**2000 is the largest kind of integer weights_only reads (LONG1; it refuses LONG4)
    state = {"model": {**net.state_dict(), "[/x]\x1b[2Jname": torch.ones(1)}, "step": 2**2000,
             "loader\x1b[2J": {"epoch_start": 1, "batches_done": torch.ones(3, 3)}, 12: "x",
             "optimizer": ["not", "a", "dict"]}
    torch.save({"trainwise_checkpoint": 1, "meta": meta, "state": state, "rng": None}, path)


def test_inspect_escapes_a_hostile_meta_and_names(tmp_path, net, capsys):
    path = tmp_path / "hostile.pt"
    hostile_checkpoint(path, net)
    for fmt in ("table", "json"):
        code, out, err = run_cli(capsys, "inspect", path, "--format", fmt)
        assert code == 0 and err == "", err
        assert not any(ord(c) < 32 and c not in "\n" for c in out), repr(out[:500])
        assert "\x7f" not in out and "\x9b" not in out
        assert len(out) < 20_000
    assert "\\x1b[2J" in out or "\\u001b[2J" in out


def test_inspect_of_a_meta_that_is_not_a_mapping(tmp_path, net, capsys):
    path = tmp_path / "odd.pt"
    torch.save({"trainwise_checkpoint": 1, "meta": ["a", "list"], "state": {"model": net.state_dict()},
                "rng": None}, path)
    code, out, err = run_cli(capsys, "inspect", path)
    assert code == 0 and "trainwise training checkpoint" in out, err


def test_garbage_pickle_and_truncated_zip_are_one_line(tmp_path, net, capsys):
    import zipfile

    good = tmp_path / "good.pt"
    torch.save(net.state_dict(), good)
    bad = tmp_path / "bad.pt"
    with zipfile.ZipFile(good) as source, zipfile.ZipFile(bad, "w") as target:
        for info in source.infolist():
            data = source.read(info.filename)
            target.writestr(info, bytes(range(256)) if info.filename.endswith("data.pkl") else data)
    for argv in (("inspect", bad), ("convert", bad, tmp_path / "o.safetensors")):
        assert_one_error_line(*run_cli(capsys, *argv))


def test_inspect_of_a_deeply_nested_meta(tmp_path, capsys):
    import io
    import struct
    import zipfile

    def text(value: str) -> bytes:
        return b"X" + struct.pack("<I", len(value)) + value.encode()

    deep = b"]" * 100_000 + b"a" * 99_999  # [[[...]]] 100,000 levels: torch.save itself cannot write it
    pickled = (b"\x80\x02}(" + text("trainwise_checkpoint") + b"K\x01" + text("state") + b"}" + text("rng") + b"N"
               + text("meta") + b"}(" + text("config") + deep + text("torch") + deep + b"uu.")
    buffer = io.BytesIO()
    torch.save({}, buffer)
    path = tmp_path / "deep.pt"
    with zipfile.ZipFile(buffer) as source, zipfile.ZipFile(path, "w") as target:
        for info in source.infolist():
            target.writestr(info, pickled if info.filename.endswith("data.pkl") else source.read(info))
    for fmt in ("table", "json"):
        code, out, err = run_cli(capsys, "inspect", path, "--format", fmt)
        assert code == 0 and "trainwise training checkpoint" in out and err == ""
