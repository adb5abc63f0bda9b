"""Sharded (torch.distributed.checkpoint) folders never run code from their files (issue 10, item 2).

DCP's own reader unpickles ``.metadata`` with ``pickle.load`` and the non-tensor entries of the ``.distcp``
files with ``torch.load(weights_only=False)``: a crafted folder ran its payload in ``sharded_to_single_file``,
and so did ``Trainer(resume="auto")`` when a checkpoint file named such a folder in its ``sharded`` entry.
"""

from __future__ import annotations

import os
import pickle
import random
import shlex
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from ckpt_helpers import Net
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.utils.data import TensorDataset

from trainwise import Trainer, TrainwiseError
from trainwise.checkpoint import CheckpointManager
from trainwise.checkpoint.io import atomic_torch_save
from trainwise.checkpoint.state import read_checkpoint
from trainwise.distributed import sharded_to_single_file


class _Call:
    """Pickles as ``target(*args)``: what an attacker puts in a file."""

    def __init__(self, target: Any, *args: Any) -> None:
        self.target, self.args = target, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.target, self.args


def _touch_command(marker: Path) -> str:
    return f"touch {shlex.quote(str(marker))}"


def _crafted_call(module: str, name: str, arg: str, protocol: int) -> bytes:
    """``module.name(arg)`` written by hand with the opcodes of ``protocol`` (0..5), whatever the real module is."""
    mod, nam, text = module.encode(), name.encode(), arg.encode()
    if protocol == 0:
        return b"c" + mod + b"\n" + nam + b"\n(V" + text + b"\ntR."
    if protocol == 1:
        return b"c" + mod + b"\n" + nam + b"\n(X" + struct.pack("<I", len(text)) + text + b"tR."
    if protocol in (2, 3):
        return bytes([0x80, protocol]) + b"c" + mod + b"\n" + nam + b"\nX" + struct.pack("<I", len(text)) + text \
            + b"\x85R."
    body = b"\x8c" + bytes([len(mod)]) + mod + b"\x8c" + bytes([len(nam)]) + nam + b"\x93" \
        + b"\x8c" + bytes([len(text)]) + text + b"\x85R."
    return bytes([0x80, protocol]) + body


def _crafted_inst(module: str, name: str, arg: str) -> bytes:
    """The protocol 0 INST opcode: ``module.name(arg)`` without GLOBAL nor REDUCE."""
    return b"(V" + arg.encode() + b"\ni" + module.encode() + b"\n" + name.encode() + b"\n."


def _crafted_obj(module: str, name: str, arg: str) -> bytes:
    """The protocol 1 OBJ opcode: ``module.name(arg)``."""
    text = arg.encode()
    return b"(c" + module.encode() + b"\n" + name.encode() + b"\nX" + struct.pack("<I", len(text)) + text + b"o."


def test_the_crafted_pickles_are_valid() -> None:
    """The hand-written payloads really call their target with a plain unpickler (here a harmless one)."""
    for protocol in range(6):
        assert pickle.loads(_crafted_call("builtins", "len", "abc", protocol)) == 3
    assert pickle.loads(_crafted_inst("builtins", "str", "abc")) == "abc"
    assert pickle.loads(_crafted_obj("builtins", "str", "abc")) == "abc"


def _folder(root: Path, metadata: bytes, name: str = "sharded-step000000001") -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / ".metadata").write_bytes(metadata)
    (folder / "__0_0.distcp").write_bytes(b"")
    return folder


def _refused(folder: Path, tmp_path: Path, match: str | None = None) -> TrainwiseError:
    with pytest.raises(TrainwiseError, match=match) as info:
        sharded_to_single_file(folder, tmp_path / "out.pt")
    message = str(info.value)
    assert message.count(". ") == 0 and message.endswith("."), message  # one sentence
    assert not (tmp_path / "out.pt").exists()
    return info.value


# -- (a) the attack on sharded_to_single_file ------------------------------------------------------------


def test_metadata_with_a_payload_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    folder = _folder(tmp_path, pickle.dumps(_Call(os.system, _touch_command(marker))))
    error = _refused(folder, tmp_path)
    assert "posix.system" in str(error) or "nt.system" in str(error)
    assert not marker.exists()


def test_payload_in_a_non_tensor_entry_of_a_distcp_file_never_runs(tmp_path: Path) -> None:
    """Real metadata; the payload is a non-tensor value, which DCP loads with torch.load(weights_only=False)."""
    marker = tmp_path / "pwned"
    folder = tmp_path / "sharded-step000000001"
    dcp.save({"model": {"w": torch.ones(2)}, "extra": _Call(os.system, _touch_command(marker))},
             checkpoint_id=str(folder), no_dist=True)
    assert not marker.exists()
    _refused(folder, tmp_path, match="extra")
    assert not marker.exists()


# -- (b) the attack through Trainer(resume="auto") on a plain single-process run ----------------------------


def _fit(run_dir: Path, *, epochs: int, resume: str | None = None) -> Any:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(24, 4), torch.randint(0, 3, (24,)))
    return Trainer(epochs=epochs, batch_size=8, run_dir=str(run_dir), progress="off", plot=False, device="cpu",
                   diagnose=False, resume=resume).fit(Net(), data)


@pytest.mark.parametrize("pointer", ["../../evil", "sharded-step000000001", "/abs/evil", 7])
def test_resume_refuses_a_sharded_pointer_in_a_single_process_run(tmp_path: Path, pointer: Any) -> None:
    run = tmp_path / "run"
    _fit(run, epochs=1)
    latest = CheckpointManager(run).latest()
    assert latest is not None
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Call(os.system, _touch_command(marker)))
    _folder(tmp_path, payload, name="evil")  # what "../../evil" reaches from run/checkpoints/
    _folder(run / "checkpoints", payload)  # "sharded-step000000001" beside the file
    checkpoint = read_checkpoint(latest)
    checkpoint["state"]["sharded"] = pointer  # a plain dict: passes weights_only
    atomic_torch_save(checkpoint, latest)
    with pytest.raises(TrainwiseError, match="sharded") as info:
        _fit(run, epochs=2, resume="auto")
    assert str(info.value).count(". ") == 0
    assert not marker.exists()


def test_sharded_pointer_rules_under_fsdp(tmp_path: Path) -> None:
    """The pointer must be a plain ``sharded-stepN`` folder beside the checkpoint file, on an FSDP run."""
    from trainwise.checkpoint.dcp import sharded_folder

    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    ckpt = checkpoints / "ckpt-step000000002.pt"
    ckpt.write_bytes(b"")
    good = checkpoints / "sharded-step000000002"
    good.mkdir()
    assert sharded_folder(ckpt, "sharded-step000000002", fsdp=True) == good
    outside = tmp_path / "outside"
    outside.mkdir()
    (checkpoints / "sharded-step000000003").symlink_to(outside, target_is_directory=True)
    (checkpoints / "sharded-step000000004").write_bytes(b"")
    bad = ["../../outside", "sharded-step000000002/..", "/tmp", "sharded-step000000003", "sharded-step000000004",
           "sharded-step000000009", "sharded-step2x", "", None, 3, b"sharded-step000000002", ["a"]]
    for name in bad:
        with pytest.raises(TrainwiseError, match="sharded"):
            sharded_folder(ckpt, name, fsdp=True)
    with pytest.raises(TrainwiseError, match="not an FSDP run"):
        sharded_folder(ckpt, "sharded-step000000002", fsdp=False)


# -- (c) crafted .metadata variants: always TrainwiseError, never another exception, never code ------------


_TARGETS = [("os", "system"), ("posix", "system"), ("nt", "system"), ("builtins", "eval"), ("builtins", "exec"),
            ("subprocess", "Popen"), ("subprocess", "check_call"), ("__builtin__", "eval"), ("torch", "load"),
            ("pickle", "loads"), ("copyreg", "_reconstructor"), ("torch.distributed.checkpoint.metadata", "torch"),
            ("torch.distributed.checkpoint.metadata", "os"), ("torch", "Tensor"), ("torch", "_utils")]


def _payloads(marker: Path) -> dict[str, bytes]:
    command = _touch_command(marker)
    code = f"open({str(marker)!r}, 'w')"
    found: dict[str, bytes] = {}
    for module, name in _TARGETS:
        arg = code if name in ("eval", "exec") else command
        for protocol in range(6):
            found[f"{module}.{name}-p{protocol}"] = _crafted_call(module, name, arg, protocol)
        found[f"{module}.{name}-inst"] = _crafted_inst(module, name, arg)
        found[f"{module}.{name}-obj"] = _crafted_obj(module, name, arg)
    for protocol in range(6):  # pickled by pickle itself, from the real functions
        found[f"real-system-p{protocol}"] = pickle.dumps(_Call(os.system, command), protocol=protocol)
        found[f"real-eval-p{protocol}"] = pickle.dumps(_Call(eval, code), protocol=protocol)
        found[f"real-popen-p{protocol}"] = pickle.dumps(_Call(subprocess.Popen, ["touch", str(marker)]),
                                                        protocol=protocol)
        # the payload hidden inside an otherwise genuine Metadata
        found[f"nested-p{protocol}"] = pickle.dumps(
            Metadata({"w": BytesStorageMetadata()}, planner_data=_Call(os.system, command)), protocol=protocol
        )
    found["ext-opcode"] = b"\x80\x02\x82\x01."  # EXT1 code 1 (copyreg's extension registry)
    found["persistent-id"] = b"\x80\x02X\x01\x00\x00\x00aQ."  # BINPERSID
    return found


def _valid_metadata_pickle() -> bytes:
    return pickle.dumps(_metadata({"w": _tensor_meta([4], [([0], [4])])}, {"w": [0]}))


def _tensor_meta(size: list[int], chunks: list[tuple[list[int], list[int]]], dtype: Any = torch.float32) -> Any:
    return TensorStorageMetadata(
        TensorProperties(dtype=dtype), torch.Size(size),
        [ChunkStorageMetadata(torch.Size(o), torch.Size(s)) for o, s in chunks],
    )


def _metadata(entries: dict[str, Any], offsets: dict[str, list[int] | None], *, path: str = "__0_0.distcp",
              length: int = 64, **fields: Any) -> Metadata:
    storage = {MetadataIndex(fqn, off): _StorageInfo(path, 0, length) for fqn, off in offsets.items()}
    return Metadata(entries, planner_data=fields.pop("planner_data", {k: (k,) for k in entries}),
                    storage_data=fields.pop("storage_data", storage), **fields)


def _deep_key(depth: int) -> bytes:
    """``{((((...)))): 1}``: hashing a key nested 200,000 deep crashes the process (C stack) in plain pickle."""
    return b"\x80\x04}" + b")" + b"\x85" * depth + b"K\x01s."


@pytest.mark.slow
def test_a_deeply_nested_key_is_refused_before_it_is_hashed(tmp_path: Path) -> None:
    folder = _folder(tmp_path, _deep_key(200_000))
    script = "\n".join([
        "import sys",
        "from trainwise import TrainwiseError",
        "from trainwise.checkpoint.dcp import read_dcp_metadata",
        "try:",
        "    read_dcp_metadata(sys.argv[1])",
        "except TrainwiseError as exc:",
        "    print(exc)",
    ])
    done = subprocess.run([sys.executable, "-c", script, str(folder)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]  # a crash would be -11 (SIGSEGV)
    assert "dict key" in done.stdout


def _malformed() -> dict[str, tuple[bytes, str]]:
    """Each variant and a phrase of the reason it is refused with."""
    good = _valid_metadata_pickle()
    noise = random.Random(1).randbytes(2048)
    w = _tensor_meta([4], [([0], [4])])
    with_extra = _metadata({"w": w}, {"w": [0]})
    with_extra.__dict__["surprise"] = 1
    bad_objects: dict[str, tuple[Any, str]] = {
        "not-metadata": ({"w": w}, "a dict where DCP writes a Metadata"),
        "a-list": ([1, 2, 3], "a list where"),
        "sdm-a-string": (Metadata("oops"), "state_dict_metadata that is not a dict"),
        "sdm-int-key": (_metadata({1: BytesStorageMetadata()}, {}), "dict key that is neither"),
        "sdm-bad-value": (_metadata({"w": "tensor"}, {}), "neither a tensor nor bytes"),
        "dtype-a-string": (_metadata({"w": _tensor_meta([4], [([0], [4])], dtype="float32")}, {"w": [0]}),
                           "dtype or layout"),
        "chunk-out-of-bounds": (_metadata({"w": _tensor_meta([4], [([2], [4])])}, {"w": [2]}), "beyond the tensor"),
        "chunk-wrong-rank": (_metadata({"w": _tensor_meta([4], [([0, 0], [4, 1])])}, {"w": [0, 0]}),
                             "number of dimensions"),
        "negative-size": (_metadata({"w": _tensor_meta([-4], [([0], [0])])}, {"w": [0]}), "non-negative"),
        "huge-tensor": (_metadata({"w": _tensor_meta([1 << 40], [([0], [1 << 40])])}, {"w": [0]}),
                        "larger than the bytes stored"),
        "chunk-without-storage": (_metadata({"w": w}, {}), "no stored bytes"),
        "bytes-without-storage": (_metadata({"n": BytesStorageMetadata()}, {}), "no stored bytes"),
        "path-traversal": (_metadata({"w": w}, {"w": [0]}, path="../../etc/passwd"), "outside the folder"),
        "absolute-path": (_metadata({"w": w}, {"w": [0]}, path="/etc/passwd"), "outside the folder"),
        "missing-file": (_metadata({"w": w}, {"w": [0]}, path="__9_0.distcp"), "not a file of the folder"),
        "beyond-the-file": (_metadata({"w": w}, {"w": [0]}, length=10**9), "beyond the end"),
        "negative-offset": (_metadata({"w": w}, {"w": [0]}, storage_data={
            MetadataIndex("w", [0]): _StorageInfo("__0_0.distcp", -1, 10)}), "non-negative integer"),
        "bool-length": (_metadata({"w": w}, {"w": [0]}, storage_data={
            MetadataIndex("w", [0]): _StorageInfo("__0_0.distcp", 0, True)}), "non-negative integer"),
        "transform": (_metadata({"w": w}, {"w": [0]}, storage_data={
            MetadataIndex("w", [0]): _StorageInfo("__0_0.distcp", 0, 10, ["stream.zstd/1"])}), "transform"),
        "storage-key-not-index": (_metadata({"w": w}, {"w": [0]}, storage_data={
            "w": _StorageInfo("__0_0.distcp", 0, 10)}), "where DCP writes a MetadataIndex"),
        "storage-value-not-info": (_metadata({"w": w}, {"w": [0]}, storage_data={MetadataIndex("w", [0]): 5}),
                                   "where DCP writes a _StorageInfo"),
        "planner-data-a-list": (_metadata({"w": w}, {"w": [0]}, planner_data=[1]), "planner_data"),
        "planner-path-float": (_metadata({"w": w}, {"w": [0]}, planner_data={"w": ("w", 1.5)}), "planner_data"),
        "planner-huge-index": (_metadata({"w": w}, {"w": [0]}, planner_data={"w": ("w", 10**12)}), "planner_data"),
        "version-an-int": (_metadata({"w": w}, {"w": [0]}, version=3), "version"),
        "storage-meta-a-dict": (_metadata({"w": w}, {"w": [0]}, storage_meta={"a": 1}), "StorageMeta"),
        "extra-attribute": (with_extra, "fields it does not have"),
    }
    found = {name: (pickle.dumps(obj), reason) for name, (obj, reason) in bad_objects.items()}
    deep_key = _deep_key(1000)
    found.update({
        "empty": (b"", "truncated or corrupt"),
        "truncated": (good[: len(good) // 2], "truncated or corrupt"),
        "one-byte": (good[:1], "truncated or corrupt"),
        "random": (noise, "truncated or corrupt"),
        "random-after-proto": (b"\x80\x04" + noise, "truncated or corrupt"),
        "json": (b'{"state_dict_metadata": {}}', "truncated or corrupt"),
        "trailing-garbage": (good + b"garbage", "after the end"),
        "deep-nesting": (b"\x80\x04" + b"]" * 100_000 + b".", "a list where"),
        "deep-key": (deep_key, "dict key"),
        "stop-only": (b".", "truncated or corrupt"),
        "text": (b"hello\n", "truncated or corrupt"),
    })
    return found


def test_metadata_payloads_are_refused_and_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payloads = _payloads(marker)
    assert len(payloads) > 100
    for index, (name, data) in enumerate(payloads.items()):
        folder = _folder(tmp_path / str(index), data)
        try:
            _refused(folder, tmp_path)
        except BaseException as exc:  # name the payload that got through
            raise AssertionError(f"payload {name}: {type(exc).__name__}: {exc}") from None
        assert not marker.exists(), name


def test_malformed_metadata_is_one_sentence_never_another_exception(tmp_path: Path) -> None:
    for index, (name, (data, reason)) in enumerate(_malformed().items()):
        folder = _folder(tmp_path / str(index), data)
        (folder / "__0_0.distcp").write_bytes(b"\0" * 64)
        try:
            error = _refused(folder, tmp_path)
        except BaseException as exc:
            raise AssertionError(f"variant {name}: {type(exc).__name__}: {exc}") from None
        assert reason in str(error), (name, str(error))


def test_genuine_metadata_reads_at_every_protocol_dcp_can_write(tmp_path: Path) -> None:
    """DCP writes with pickle's default protocol (4, or 5 on newer Pythons); 2 and 3 read too."""
    from trainwise.checkpoint.dcp import read_dcp_metadata

    folder = tmp_path / "plain"
    dcp.save({"model": Net().state_dict(), "n": 1}, checkpoint_id=folder, no_dist=True)
    original = pickle.loads((folder / ".metadata").read_bytes())
    for protocol in (2, 3, 4, 5):
        (folder / ".metadata").write_bytes(pickle.dumps(original, protocol=protocol))
        checked = read_dcp_metadata(folder)
        assert checked.state_dict_metadata == original.state_dict_metadata
        assert checked.storage_data == original.storage_data
        assert checked.planner_data == original.planner_data
        assert sharded_to_single_file(folder, tmp_path / "out.pt").keys() == Net().state_dict().keys()


def test_folder_problems_are_one_sentence(tmp_path: Path) -> None:
    _refused(tmp_path / "missing", tmp_path, match="does not exist")
    (tmp_path / "file").write_bytes(b"x")
    _refused(tmp_path / "file", tmp_path, match="not a folder")
    (tmp_path / "empty").mkdir()
    _refused(tmp_path / "empty", tmp_path, match=r"\.metadata")
    (tmp_path / "dir-meta" / ".metadata").mkdir(parents=True)
    _refused(tmp_path / "dir-meta", tmp_path)


# -- (d) genuine folders still load --------------------------------------------------------------------------


def test_a_plain_dcp_save_converts_to_one_file(tmp_path: Path) -> None:
    net = Net()
    folder = tmp_path / "plain"
    extras = {"n": 3, "f": 0.5, "s": "text", "none": None, "pair": (1, 2), "ints": torch.arange(5),
              "bf16": torch.ones(3, dtype=torch.bfloat16)}
    dcp.save({"model": net.state_dict(), **extras}, checkpoint_id=folder, no_dist=True)  # a Path: pickled as such
    state = sharded_to_single_file(folder, tmp_path / "model.pt")
    assert state.keys() == net.state_dict().keys()
    for key, value in net.state_dict().items():
        assert torch.equal(state[key], value), key
    assert torch.load(tmp_path / "model.pt", weights_only=True).keys() == state.keys()


def test_safe_reader_loads_everything_dcp_wrote(tmp_path: Path) -> None:
    from trainwise.checkpoint.dcp import read_dcp_metadata, read_dcp_state

    folder = tmp_path / "plain"
    saved = {"w": torch.randn(3, 4), "i": torch.arange(4), "h": torch.ones(2, dtype=torch.float16),
             "scalar": torch.tensor(2.5), "n": 3, "s": "text", "none": None, "nested": {"a": torch.ones(1), "b": 1.5},
             "list": [1, 2]}
    dcp.save(saved, checkpoint_id=str(folder), no_dist=True)
    meta = read_dcp_metadata(folder)
    assert set(meta.state_dict_metadata) >= {"w", "i", "h", "scalar", "n", "s", "none", "nested.a", "nested.b"}
    loaded = read_dcp_state(folder)
    assert loaded.keys() == saved.keys()
    for key in ("w", "i", "h", "scalar"):
        assert torch.equal(loaded[key], saved[key]) and loaded[key].dtype == saved[key].dtype
    assert torch.equal(loaded["nested"]["a"], saved["nested"]["a"]) and loaded["nested"]["b"] == 1.5
    assert (loaded["n"], loaded["s"], loaded["none"], loaded["list"]) == (3, "text", None, [1, 2])
    # dcp.load into a state dict of the right shapes, through the safe reader
    from trainwise.checkpoint.dcp import load_dcp

    target = {"w": torch.zeros(3, 4), "i": torch.zeros(4, dtype=torch.int64)}
    load_dcp(target, folder)
    assert torch.equal(target["w"], saved["w"]) and torch.equal(target["i"], saved["i"])
