"""Seeded, structure-aware fuzzing of every checkpoint loader (issue 10, item 4).

Valid ``.pt`` zip, ``.pt`` legacy and ``.safetensors`` files are mutated (bytes flipped, files cut, zip members
dropped, duplicated, renamed, swapped or declared huge, pickles carrying code-running payloads spliced into
``data.pkl`` and the legacy stream, safetensors headers with huge lengths, negative or overlapping offsets and
unknown dtypes), then read through ``safe_load``, ``load_weights`` and ``trainwise ckpt inspect/convert``.

Whatever the file, the payloads' marker file never appears, the API raises nothing but TrainwiseError, and the
CLI exits 0 or 2, with exactly one line and no traceback on stderr for 2, and no control characters from the
file in anything it prints. A failing case is saved under the test's tmp folder and named in the assertion.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import random
import time
import traceback
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
from _mutate import (
    RUNS_UNSAFELY,
    inject_pickle,
    mutate_bytes,
    mutate_pickle_stream,
    mutate_safetensors,
    mutate_zip,
    pickle_payloads,
    read_zip,
    write_zip,
)

from trainwise import load_weights
from trainwise.checkpoint import safe_load, save_checkpoint
from trainwise.checkpoint.weights import safetensors_bytes
from trainwise.cli import main
from trainwise.errors import TrainwiseError

SEED = 0
CASES = {"zip": 140, "trainwise": 60, "legacy": 110, "safetensors": 110}  # 420 files, 6 loaders each


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Linear(4, 6)
        self.norm = torch.nn.BatchNorm1d(6)
        self.head = torch.nn.Linear(6, 2)


def base_files() -> dict[str, bytes]:
    torch.manual_seed(0)
    model = Small()
    weights = model.state_dict()
    zipped, legacy = io.BytesIO(), io.BytesIO()
    torch.save({"state_dict": weights, "epoch": 3}, zipped)
    torch.save(weights, legacy, _use_new_zipfile_serialization=False)
    return {
        "zip": zipped.getvalue(),
        "legacy": legacy.getvalue(),
        "safetensors": safetensors_bytes(weights),
        "trainwise": b"",  # filled by the fixture (save_checkpoint writes a file)
    }


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    files = base_files()
    folder = tmp_path_factory.mktemp("bases")
    model = Small()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    path = save_checkpoint(folder / "ckpt.pt", {"model": model, "optimizer": optimizer, "step": 5},
                           config={"lr": 0.1, "epochs": 2})
    files["trainwise"] = path.read_bytes()
    return files


def mutated(kind: str, data: bytes, rng: random.Random, payloads: dict[str, bytes]) -> bytes:
    if kind in ("zip", "trainwise"):
        return mutate_zip(data, rng, payloads=payloads)
    if kind == "legacy":
        return mutate_pickle_stream(data, rng, payloads)
    return mutate_safetensors(data, rng, payloads)


def suffix_for(kind: str, rng: random.Random) -> str:
    honest = ".safetensors" if kind == "safetensors" else rng.choice((".pt", ".pth", ".bin", ".ckpt"))
    lying = ".pt" if kind == "safetensors" else ".safetensors"
    return lying if rng.random() < 0.15 else honest


def no_control_characters(text: str) -> bool:
    return not any((ord(c) < 32 and c not in "\n") or 0x7F <= ord(c) <= 0x9F for c in text)


def crash(label: str, exc: BaseException) -> str:
    """One line for the crash, then where it happened (the innermost frames)."""
    where = "".join(traceback.format_tb(exc.__traceback__)[-2:]).rstrip()
    return f"{label}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}\n{where}"


def check_api(call, problems: list[str], label: str) -> None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            call()
    except TrainwiseError as exc:
        if "\x1b" in str(exc):
            problems.append(f"{label}: control characters in the message {str(exc)[:300]!r}")
    except BaseException as exc:  # anything else is a crash the fuzzer found
        problems.append(crash(label, exc))


def check_cli(argv: list[str], problems: list[str], label: str) -> None:
    out, err = io.StringIO(), io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            warnings.simplefilter("ignore")
            code = main(argv)
    except BaseException as exc:
        problems.append(crash(label, exc))
        return
    lines = err.getvalue().strip().splitlines()
    if code not in (0, 2):
        problems.append(f"{label}: exit code {code}")
    if code == 2 and (len(lines) != 1 or not lines[0].startswith("trainwise ckpt: error: ")):
        problems.append(f"{label}: exit 2 with stderr {err.getvalue()[:500]!r}")
    if "Traceback" in err.getvalue():
        problems.append(f"{label}: a traceback on stderr")
    if not (no_control_characters(out.getvalue()) and no_control_characters(err.getvalue())):
        problems.append(f"{label}: control characters in the output {(out.getvalue() + err.getvalue())[:500]!r}")


def run_every_loader(path: Path, out: Path, problems: list[str], label: str) -> None:
    check_api(lambda: safe_load(path), problems, f"{label} safe_load")
    check_api(lambda: load_weights(Small(), path), problems, f"{label} load_weights")
    check_api(lambda: load_weights(Small(), path, strict=False), problems, f"{label} load_weights(strict=False)")
    check_cli(["ckpt", "inspect", str(path)], problems, f"{label} ckpt inspect")
    check_cli(["ckpt", "inspect", str(path), "--format", "json"], problems, f"{label} ckpt inspect --format json")
    check_cli(["ckpt", "convert", str(path), str(out), "--force"], problems, f"{label} ckpt convert")


@pytest.mark.parametrize("kind", sorted(CASES))
@pytest.mark.slow
def test_fuzz_checkpoint_loaders(kind, bases, tmp_path):
    rng = random.Random(f"{SEED}-{kind}")
    marker = tmp_path / "marker"
    payloads = pickle_payloads(marker)
    work, failed = tmp_path / "work", tmp_path / "failed"
    work.mkdir()
    failed.mkdir()
    problems: list[str] = []
    began = time.perf_counter()
    for case in range(CASES[kind]):
        data = mutated(kind, bases[kind], rng, payloads)
        if rng.random() < 0.2:  # a second round now and then: damage on top of damage
            data = mutated(kind, data, rng, payloads)
        path = work / f"case{case:03d}{suffix_for(kind, rng)}"
        path.write_bytes(data)
        before = len(problems)
        out = work / rng.choice(("out.safetensors", "out.pt"))
        run_every_loader(path, out, problems, f"{kind} case {case}")
        if marker.exists():
            problems.append(f"{kind} case {case}: THE MARKER EXISTS: code from the file ran")
            marker.unlink()
        if len(problems) > before:
            (failed / path.name).write_bytes(data)
        path.unlink()
    seconds = time.perf_counter() - began
    assert not problems, f"{len(problems)} problems (inputs saved in {failed}):\n" + "\n".join(problems[:12])
    assert seconds < 60, f"{CASES[kind]} {kind} cases took {seconds:.0f} s"


def test_the_payloads_have_teeth(tmp_path):
    """Unpickled unsafely, every payload (alone or spliced into a real checkpoint) really runs code."""
    marker = tmp_path / "marker"
    payloads = pickle_payloads(marker)
    for name in sorted(RUNS_UNSAFELY):
        pickle.loads(payloads[name])
        assert marker.exists(), name
        marker.unlink()
    buffer = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buffer)
    members = read_zip(buffer.getvalue())
    rng = random.Random(SEED)
    for name in ("p2 __reduce__ to a function", "p0 GLOBAL os.system REDUCE", "p2 BUILD with __setstate__"):
        spliced = [(info, inject_pickle(data, payloads[name], rng) if info.filename.endswith("data.pkl") else data)
                   for info, data in members]
        path = tmp_path / "evil.pt"
        path.write_bytes(write_zip(spliced))
        with contextlib.suppress(Exception):
            torch.load(path, weights_only=False)
        assert marker.exists(), name
        marker.unlink()
        with pytest.raises(TrainwiseError):
            safe_load(path)
        assert not marker.exists(), name


def test_every_payload_in_every_format_is_refused(bases, tmp_path):
    """Each payload, alone, in data.pkl of a zip, in the legacy stream: refused, and the marker never appears."""
    marker = tmp_path / "marker"
    payloads = pickle_payloads(marker)
    rng = random.Random(SEED)
    problems: list[str] = []
    zip_members = read_zip(bases["zip"])
    for name, payload in sorted(payloads.items()):
        files = {
            "bare.pt": payload,
            "in-zip.pt": write_zip([(info, payload if info.filename.endswith("data.pkl") else data)
                                    for info, data in zip_members]),
            "spliced-zip.pt": write_zip([(info, inject_pickle(data, payload, rng) if info.filename.endswith(
                "data.pkl") else data) for info, data in zip_members]),
            "legacy.pt": mutate_pickle_stream(bases["legacy"], random.Random(name), {name: payload}),
        }
        for file_name, data in files.items():
            path = tmp_path / file_name
            path.write_bytes(data)
            run_every_loader(path, tmp_path / "out.safetensors", problems, f"{name} in {file_name}")
            assert not marker.exists(), f"{name} in {file_name} ran"
    assert not problems, "\n".join(problems[:20])


def test_mutations_are_reproducible(bases):
    payloads = pickle_payloads("/tmp/marker")
    for kind in CASES:
        first = [mutated(kind, bases[kind], random.Random(5), payloads) for _ in range(3)]
        again = [mutated(kind, bases[kind], random.Random(5), payloads) for _ in range(3)]
        assert first == again


def test_mutate_bytes_and_zip_helpers_are_generic():
    rng = random.Random(1)
    assert mutate_bytes(b"", rng)  # never stuck on empty input
    archive = write_zip([("a/data.pkl", pickle.dumps([1, 2])), ("a/x", b"123")])
    seen = {mutate_zip(archive, rng, payloads=pickle_payloads("/tmp/m")) for _ in range(40)}
    assert len(seen) > 20
    assert all(isinstance(name, str) for name in zipfile.ZipFile(io.BytesIO(archive)).namelist())
