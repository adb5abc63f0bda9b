"""Atomic writes, format detection, weights_only loading and its refusals, full-state save/restore."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from ckpt_helpers import Net, make_bad_inputs

from trainwise.checkpoint import load_checkpoint, safe_load, save_checkpoint
from trainwise.checkpoint.io import atomic_torch_save, atomic_write, detect_format, is_temp_file
from trainwise.checkpoint.state import decode_rng_state, encode_rng_state
from trainwise.errors import TrainwiseError
from trainwise.seeding import get_rng_state, set_rng_state


def test_atomic_write_failure_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "ckpt.pt"
    atomic_torch_save({"w": torch.ones(3)}, target)
    before = target.read_bytes()

    def half_then_crash(file):
        file.write(b"PK\x03\x04 partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(target, half_then_crash)
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_atomic_write_refuses_missing_folder_and_directory_target(tmp_path):
    with pytest.raises(TrainwiseError, match="does not exist"):
        atomic_torch_save({}, tmp_path / "nope" / "x.pt")
    (tmp_path / "d.pt").mkdir()
    with pytest.raises(TrainwiseError, match="is a directory"):
        atomic_torch_save({}, tmp_path / "d.pt")


def test_temp_file_names():
    assert is_temp_file(".ckpt-step000000001.pt.tmp-123-abcd1234")
    assert not is_temp_file("ckpt-step000000001.pt")


def test_formats_are_detected_without_unpickling(tmp_path):
    torch.save({"w": torch.ones(2)}, tmp_path / "zip.pt")
    torch.save({"w": torch.ones(2)}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    from trainwise.checkpoint.weights import safetensors_bytes

    (tmp_path / "w.safetensors").write_bytes(safetensors_bytes({"w": torch.ones(2)}))
    assert detect_format(tmp_path / "zip.pt") == "torch-zip"
    assert detect_format(tmp_path / "legacy.pt") == "torch-legacy"
    assert detect_format(tmp_path / "w.safetensors") == "safetensors"
    for name in ("zip.pt", "legacy.pt", "w.safetensors"):
        assert torch.equal(safe_load(tmp_path / name)["w"], torch.ones(2))


@pytest.mark.parametrize(
    "kind, message",
    [
        ("zero-byte", "is empty"),
        ("truncated", "truncated or corrupt"),
        ("random", "not a checkpoint in any format"),
        ("json", "JSON/text file"),
        ("plain-pickle", "plain Python pickle"),
        ("truncated-safetensors", "truncated"),
        ("directory", "is a directory"),
        ("missing", "does not exist"),
    ],
)
def test_bad_files_are_one_sentence(tmp_path, kind, message):
    good = tmp_path / "good.pt"
    torch.save({"w": torch.randn(100, 100)}, good)
    files = make_bad_inputs(tmp_path / "bad", good)
    with pytest.raises(TrainwiseError, match=message) as info:
        safe_load(files[kind])
    text = str(info.value)
    assert "\n" not in text and text.endswith(".")


EVIL_MODULE = '''
import pathlib

def make_marker(path):
    pathlib.Path(path).write_text("code from the checkpoint ran")
    return {}

class Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (make_marker, (self.marker,))
'''


@pytest.fixture
def evil_files(tmp_path, monkeypatch):
    """Checkpoints (zip and legacy) whose unpickling would create a marker file, from a temporary module."""
    (tmp_path / "evil_mod_for_ckpt.py").write_text(textwrap.dedent(EVIL_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))  # importable: refusal must not rely on an import failing
    import evil_mod_for_ckpt

    marker = tmp_path / "marker.txt"
    payload = {"state_dict": {"w": torch.ones(2)}, "extra": evil_mod_for_ckpt.Evil(str(marker))}
    torch.save(payload, tmp_path / "evil.pt")
    torch.save(payload, tmp_path / "evil_legacy.pt", _use_new_zipfile_serialization=False)
    yield tmp_path, marker
    sys.modules.pop("evil_mod_for_ckpt", None)


@pytest.mark.parametrize("name", ["evil.pt", "evil_legacy.pt"])
def test_arbitrary_unpickling_is_refused_and_nothing_runs(evil_files, name):
    folder, marker = evil_files
    with pytest.raises(TrainwiseError) as info:
        safe_load(folder / name)
    message = str(info.value)
    assert "torch.serialization.add_safe_globals([" in message
    assert "evil_mod_for_ckpt.make_marker" in message or "evil_mod_for_ckpt" in message
    assert "\n" not in message
    from trainwise import load_weights

    with pytest.raises(TrainwiseError, match="arbitrary unpickling"):
        load_weights(Net(), folder / name)
    assert not marker.exists()
    # the test has teeth: an unsafe load of the same file does run its code
    torch.load(folder / name, weights_only=False)
    assert marker.exists()


def test_cli_refuses_unsafe_file_with_exit_2(evil_files):
    folder, marker = evil_files
    env = {"PYTHONPATH": str(folder), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-m", "trainwise.cli", "ckpt", "inspect", str(folder / "evil.pt")],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "add_safe_globals" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not marker.exists()


def test_full_state_round_trip_restores_in_place(tmp_path, net):
    optimizer = torch.optim.AdamW(net.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    net(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    scheduler.step()
    state = {"model": torch.compile(net), "optimizer": optimizer, "scheduler": scheduler, "scaler": scaler,
             "epoch": 2, "step": 17}
    path = save_checkpoint(tmp_path / "ckpt.pt", state, config={"lr": 0.1, "epochs": 3})
    raw = torch.load(path, weights_only=True)  # plain torch loads it safely
    assert not any(k.startswith("_orig_mod.") for k in raw["state"]["model"])  # saved unwrapped
    assert raw["meta"]["config"] == {"lr": 0.1, "epochs": 3} and raw["meta"]["torch"] == torch.__version__
    expected_random = torch.rand(3)  # the RNG right after saving

    torch.manual_seed(99)
    fresh = Net(hidden=8)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    fresh_sched = torch.optim.lr_scheduler.StepLR(fresh_opt, step_size=1, gamma=0.5)
    fresh_scaler = torch.amp.GradScaler("cpu")
    target = {"model": fresh, "optimizer": fresh_opt, "scheduler": fresh_sched, "scaler": fresh_scaler,
              "epoch": 0, "step": 0}
    rest = load_checkpoint(path, target)
    assert target["epoch"] == 2 and target["step"] == 17
    assert rest["meta"]["config"]["epochs"] == 3
    for a, b in zip(net.state_dict().values(), fresh.state_dict().values()):
        assert torch.equal(a, b)
    assert fresh_opt.state_dict()["state"][0]["exp_avg"].equal(optimizer.state_dict()["state"][0]["exp_avg"])
    assert fresh_sched.get_last_lr() == scheduler.get_last_lr()
    assert fresh_scaler.get_scale() == 1024.0
    assert torch.equal(torch.rand(3), expected_random)  # RNG restored to the moment of saving


def test_state_that_would_not_load_safely_is_refused_at_save_time(tmp_path):
    with pytest.raises(TrainwiseError, match="weights_only loading refuses"):
        save_checkpoint(tmp_path / "c.pt", {"stats": np.zeros(3)})
    with pytest.raises(TrainwiseError, match="could not be serialised"):
        save_checkpoint(tmp_path / "c.pt", {"fn": lambda x: x})
    assert list(tmp_path.iterdir()) == []  # no file, no temp file


def test_stateful_object_without_load_state_dict_is_refused(tmp_path):
    class Half:
        def state_dict(self):
            return {"a": 1}

    with pytest.raises(TrainwiseError, match="no load_state_dict"):
        save_checkpoint(tmp_path / "c.pt", {"half": Half()})


def test_missing_entry_is_an_error_unless_not_strict(tmp_path, net):
    path = save_checkpoint(tmp_path / "c.pt", {"model": net})
    with pytest.raises(TrainwiseError, match="has no 'optimizer'"):
        load_checkpoint(path, {"model": Net(), "optimizer": torch.optim.SGD(net.parameters(), lr=1)})
    load_checkpoint(path, {"model": Net(), "optimizer": torch.optim.SGD(net.parameters(), lr=1)}, strict=False)


def test_rng_encoding_round_trips_through_weights_only(tmp_path):
    import random

    random.random(), np.random.rand(), torch.rand(1)
    state = get_rng_state()
    torch.save(encode_rng_state(state), tmp_path / "rng.pt")
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    set_rng_state(decode_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True)))
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


def test_not_a_trainwise_checkpoint(tmp_path, net):
    torch.save(net.state_dict(), tmp_path / "w.pt")
    with pytest.raises(TrainwiseError, match="load_weights"):
        load_checkpoint(tmp_path / "w.pt", {"model": net})


def test_a_zip_that_is_not_a_torch_file(tmp_path):
    import zipfile

    with zipfile.ZipFile(tmp_path / "data.pt", "w") as archive:
        archive.writestr("readme.txt", "hello")
    with pytest.raises(TrainwiseError, match="zip archive but not a torch checkpoint"):
        safe_load(tmp_path / "data.pt")


def test_cli_parser_and_package_import_stay_free_of_torch():
    code = (
        "import sys, trainwise, trainwise.cli.ckpt as c, argparse; p = argparse.ArgumentParser(); "
        "c.register(p.add_subparsers()); print('torch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr
