"""Atomic writes, format detection, weights_only loading and its refusals, full-state save/restore."""

from __future__ import annotations

import errno
import os
import re
import stat
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest
import torch
from ckpt_helpers import Net, make_bad_inputs

from trainwise.checkpoint import load_checkpoint, safe_load, save_checkpoint
from trainwise.checkpoint.io import atomic_torch_save, detect_format
from trainwise.checkpoint.state import decode_rng_state, encode_rng_state
from trainwise.errors import DiskWriteError, TrainwiseError
from trainwise.files import atomic_write, atomic_write_bytes, atomic_write_json, is_temp_file
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


@pytest.mark.slow
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


# -- atomic writes keep the file mode (issue 10 A) -------------------------------------------------------


@pytest.mark.parametrize("mode", [0o755, 0o600, 0o640, 0o444])
def test_atomic_write_keeps_the_mode_of_the_file_it_replaces(tmp_path, mode):
    script = tmp_path / "train.py"
    script.write_text("print('old')\n")
    script.chmod(mode)
    atomic_write_bytes(script, b"print('new')\n")
    assert stat.S_IMODE(script.stat().st_mode) == mode
    assert script.read_bytes() == b"print('new')\n"
    assert [p.name for p in tmp_path.iterdir()] == ["train.py"]


def test_an_executable_script_stays_executable(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\necho old\n")
    script.chmod(0o755)
    atomic_write_bytes(script, b"#!/bin/sh\necho new\n")
    assert subprocess.run([str(script)], capture_output=True, text=True, timeout=30).stdout == "new\n"


def test_a_new_file_gets_the_default_mode(tmp_path):
    old = os.umask(0o027)
    try:
        atomic_write_bytes(tmp_path / "new.txt", b"x")
        atomic_torch_save({"w": torch.ones(1)}, tmp_path / "new.pt")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == 0o640  # 0o666 & ~umask, as open() gives
    assert stat.S_IMODE((tmp_path / "new.pt").stat().st_mode) == 0o640


# -- a full disk, a file size limit, a read-only folder (issue 10 B) -------------------------------------


def fill_disk_after(monkeypatch, limit: int, code: int = errno.ENOSPC) -> dict[str, int]:
    """Every write to an atomic_write temporary file fails with ``code`` once ``limit`` bytes are written."""
    from trainwise import files

    written = {"bytes": 0, "failures": 0}
    real = files._TempRaw.write_to_disk

    def write_to_disk(self, data):
        size = memoryview(data).nbytes
        if written["bytes"] + size > limit:
            room = limit - written["bytes"]
            if room > 0:  # a real disk takes what fits, then fails on the next write
                written["bytes"] += room
                return real(self, memoryview(data).cast("B")[:room])
            written["failures"] += 1
            raise OSError(code, os.strerror(code))
        written["bytes"] += size
        return real(self, data)

    monkeypatch.setattr(files._TempRaw, "write_to_disk", write_to_disk)
    return written


def assert_one_sentence_naming(error: BaseException, path, *words: str) -> None:
    text = str(error)
    assert isinstance(error, DiskWriteError) and isinstance(error, TrainwiseError), repr(error)
    assert "\n" not in text and text.endswith("."), text
    assert text.startswith(f"could not write {path}: "), text
    assert error.path == path
    for word in words:
        assert word in text, text


BIG_STATE = {"w": torch.arange(20_000, dtype=torch.float32), "b": torch.ones(7), "step": 3}


@pytest.mark.parametrize("limit", [0, 1, 63, 64, 65, 200, 4095, 4096, 20_000, 70_000, 80_150])
def test_full_disk_during_torch_save_keeps_the_old_file(tmp_path, monkeypatch, limit):
    target = tmp_path / "step-000100.pt"
    atomic_torch_save({"w": torch.zeros(3)}, target)
    before = target.read_bytes()
    written = fill_disk_after(monkeypatch, limit)
    with pytest.raises(DiskWriteError) as info:
        atomic_torch_save(BIG_STATE, target)
    assert written["failures"] >= 1
    assert_one_sentence_naming(info.value, target, "the disk is full", "No space left on device",
                               "free some space")
    assert info.value.errno == errno.ENOSPC
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


@pytest.mark.parametrize("limit", [0, 10, 8191, 8192, 50_000])
def test_full_disk_during_json_and_checkpoint_writes(tmp_path, monkeypatch, limit):
    target = tmp_path / "best.json"
    atomic_write_json(target, {"old": True})
    ckpt = save_checkpoint(tmp_path / "ckpt.pt", {"model": Net(), "step": 1})
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    fill_disk_after(monkeypatch, limit)
    with pytest.raises(DiskWriteError) as info:
        atomic_write_json(target, {"values": list(range(20_000))})
    assert_one_sentence_naming(info.value, target, "the disk is full")
    # save_checkpoint turns other failures of torch.save into "could not be serialised": not this one
    with pytest.raises(DiskWriteError) as info:
        save_checkpoint(ckpt, {"model": Net(), "step": 2, "big": BIG_STATE["w"]})
    assert_one_sentence_naming(info.value, ckpt, "the disk is full")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_new_file_that_does_not_fit_leaves_nothing(tmp_path, monkeypatch):
    fill_disk_after(monkeypatch, 100, errno.EDQUOT)
    with pytest.raises(DiskWriteError) as info:
        atomic_torch_save(BIG_STATE, tmp_path / "new.pt")
    assert_one_sentence_naming(info.value, tmp_path / "new.pt", "quota")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "where, code, words",
    [
        ("fsync", errno.ENOSPC, ["the disk is full"]),
        ("open", errno.EROFS, ["read-only"]),
        ("open", errno.EACCES, ["not writable"]),
        ("replace", errno.EACCES, ["not writable"]),
    ],
)
def test_failures_outside_the_writes(tmp_path, monkeypatch, where, code, words):
    from trainwise import files

    target = tmp_path / "x.json"
    target.write_text("{}\n")

    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    if where == "open":
        monkeypatch.setattr(files, "_open_temp", fail)
    else:
        monkeypatch.setattr(files.os, where, fail)
    with pytest.raises(DiskWriteError) as info:
        atomic_write_json(target, {"a": 1})
    assert_one_sentence_naming(info.value, target, *words)
    assert info.value.errno == code and isinstance(info.value, OSError)
    monkeypatch.undo()
    assert target.read_text() == "{}\n" and [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_an_unrelated_write_error_is_not_called_a_full_disk(tmp_path):
    def broken(file):
        file.write(b"partial")
        raise OSError(errno.ENOENT, "No such file or directory", "/some/font/file")

    with pytest.raises(OSError) as info:
        atomic_write(tmp_path / "plot.png", broken)
    assert not isinstance(info.value, DiskWriteError)
    assert list(tmp_path.iterdir()) == []


EFBIG_SCRIPT = r"""
import json, resource, signal, sys
import torch
from trainwise.checkpoint.io import atomic_torch_save
from trainwise.errors import DiskWriteError
from trainwise.files import atomic_write, atomic_write_json

folder = sys.argv[1]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # then write() fails with EFBIG instead of killing us
big = {"w": torch.zeros(100_000)}
jobs = {
    "zip.pt": lambda p: atomic_torch_save(big, p),
    "legacy.pt": lambda p: atomic_write(p, lambda f: torch.save(big, f, _use_new_zipfile_serialization=False)),
    "run.json": lambda p: atomic_write_json(p, {"values": list(range(100_000))}),
}
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
results = {}
for name, job in jobs.items():
    try:
        job(f"{folder}/{name}")
        results[name] = ["no error"]
    except DiskWriteError as exc:
        results[name] = ["DiskWriteError", exc.errno, str(exc), str(exc.path)]
    except BaseException as exc:
        results[name] = [type(exc).__name__, None, str(exc)]
print(json.dumps(results))
"""


@pytest.mark.slow
def test_a_real_file_size_limit_is_named(tmp_path):
    import json

    folder = tmp_path / "run"
    folder.mkdir()
    for name in ("zip.pt", "legacy.pt", "run.json"):
        (folder / name).write_bytes(b"old content of " + name.encode())
    proc = subprocess.run([sys.executable, "-c", EFBIG_SCRIPT, str(folder)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, (kind, code, message, *path) in results.items():
        assert kind == "DiskWriteError" and code == errno.EFBIG, (name, kind, message)
        assert message.startswith(f"could not write {folder / name}: the file size limit"), message
        assert "\n" not in message and path == [str(folder / name)]
        assert (folder / name).read_bytes() == b"old content of " + name.encode()
    assert sorted(p.name for p in folder.iterdir()) == ["legacy.pt", "run.json", "zip.pt"]


# -- refusals quote whole sentences (issue 10 item 12a) ---------------------------------------------------


def quoted(message: str) -> str:
    inner = re.search(r'"(.*)"', message)
    assert inner, message
    return inner.group(1)


@pytest.mark.parametrize("legacy", [True, False])
def test_refusal_of_a_blocked_module_quotes_whole_sentences(tmp_path, legacy):
    path = tmp_path / "stat.pt"
    torch.save({"w": torch.ones(2), "st": os.stat(tmp_path)}, path, _use_new_zipfile_serialization=not legacy)
    with pytest.raises(TrainwiseError) as info:
        safe_load(path)
    message = str(info.value)
    assert "\n" not in message and "os.stat_result" in message
    assert "ill likely" not in message and "add_safe_globals" not in message  # allowing os.* never works
    assert "arbitrary code" in message and "must not be loaded unsafely" in message


@pytest.mark.parametrize("name", ["exec", "eval", "getattr", "__import__"])
def test_a_code_running_builtin_is_never_offered_for_allowing(tmp_path, name):
    import builtins
    import pickle

    class Payload:
        def __reduce__(self):
            return (getattr(builtins, name), ("1",) if name != "getattr" else (1, "real"))

    path = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(2)}, path)
    with zipfile.ZipFile(path) as source:
        members = [(info, source.read(info)) for info in source.infolist()]
    payload = pickle.dumps(Payload(), protocol=2)
    with zipfile.ZipFile(path, "w") as target:
        for info, content in members:
            target.writestr(info, payload if info.filename.endswith("data.pkl") else content)
    with pytest.raises(TrainwiseError) as info:
        safe_load(path)
    message = str(info.value)
    assert name in message and "add_safe_globals" not in message and "arbitrary code" in message


def test_refusal_of_a_legacy_file_names_the_class_in_full(tmp_path, monkeypatch):
    (tmp_path / "legacy_mod_for_ckpt.py").write_text("class Thing:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import legacy_mod_for_ckpt

    path = tmp_path / "legacy.pt"
    torch.save({"w": torch.ones(2), "x": legacy_mod_for_ckpt.Thing()}, path, _use_new_zipfile_serialization=False)
    sys.modules.pop("legacy_mod_for_ckpt", None)
    with pytest.raises(TrainwiseError) as info:
        safe_load(path)
    message = str(info.value)
    assert "legacy_mod_for_ckpt.Thing" in message and "add_safe_globals([legacy_mod_for_ckpt.Thing])" in message
    assert "\n" not in message


def test_garbage_pickle_in_a_zip_is_called_corrupt_and_quoted_whole(tmp_path):
    good = tmp_path / "good.pt"
    torch.save({"w": torch.ones(2)}, good)
    bad = tmp_path / "bad.pt"
    with zipfile.ZipFile(good) as source, zipfile.ZipFile(bad, "w") as target:
        for info in source.infolist():
            data = source.read(info.filename)
            target.writestr(info, b"\x80\x02garbage" + bytes(range(40)) if info.filename.endswith("data.pkl") else data)
    with pytest.raises(TrainwiseError) as info:
        safe_load(bad)
    message = str(info.value)
    assert "\n" not in message and "corrupt" in message and "ill likely" not in message
    assert "arbitrary unpickling" not in message  # garbage is not a class to allow
    text = quoted(message)
    assert text[:1].isupper() and " " in text and not text.endswith(" "), text


# -- files whose name lies, hostile content (issue 10 item 9) -------------------------------------------


def test_a_torch_file_named_safetensors_loads_by_content_and_says_so(tmp_path):
    path = tmp_path / "weights.safetensors"
    torch.save({"w": torch.ones(2)}, path)
    with pytest.warns(UserWarning, match=r"weights.safetensors is a torch zip checkpoint.*name"):
        loaded = safe_load(path)
    assert torch.equal(loaded["w"], torch.ones(2))


def test_a_safetensors_file_named_pt_loads_by_content_and_says_so(tmp_path):
    from trainwise.checkpoint.weights import safetensors_bytes

    path = tmp_path / "weights.pt"
    path.write_bytes(safetensors_bytes({"w": torch.ones(2)}))
    with pytest.warns(UserWarning, match=r"weights.pt is a safetensors file.*name"):
        assert torch.equal(safe_load(path)["w"], torch.ones(2))


def test_a_huge_declared_size_in_the_zip_directory_is_refused_fast(tmp_path):
    import time

    good = tmp_path / "good.pt"
    torch.save({"w": torch.ones(1000)}, good)
    data = bytearray(good.read_bytes())
    # the central directory records' uncompressed size of every member: claim 2**32-2 bytes each
    start = 0
    while (start := data.find(b"PK\x01\x02", start)) >= 0:
        data[start + 24:start + 28] = (2**32 - 2).to_bytes(4, "little")
        start += 4
    bomb = tmp_path / "bomb.pt"
    bomb.write_bytes(bytes(data))
    began = time.perf_counter()
    with pytest.raises(TrainwiseError) as info:
        safe_load(bomb)
    assert time.perf_counter() - began < 5
    assert "\n" not in str(info.value)


def test_an_error_never_carries_control_characters_from_the_file(tmp_path):
    # a pickle GLOBAL whose name holds a terminal escape sequence
    payload = b"\x80\x02c" + b"evil\x1b[2J\nthing\x1b[31m\n" + b"q\x00."
    good = tmp_path / "good.pt"
    torch.save({"w": torch.ones(2)}, good)
    bad = tmp_path / "bad.pt"
    with zipfile.ZipFile(good) as source, zipfile.ZipFile(bad, "w") as target:
        for info in source.infolist():
            data = source.read(info.filename)
            target.writestr(info, payload if info.filename.endswith("data.pkl") else data)
    with pytest.raises(TrainwiseError) as info:
        safe_load(bad)
    message = str(info.value)
    assert "\x1b" not in message and "\n" not in message and "\\x1b" in message
