"""Faults and mistakes around a Trainer run: each is refused or reported in one sentence, nothing is damaged.

Built from the faults themselves: two writers on one run folder, a full disk and a file size limit while
checkpointing, a read-only folder, NaN options, wrong factories, empty data, absurd worker counts, a
damaged newest checkpoint, a NaN loss.
"""

import errno
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainwise import NonFiniteLossError, Trainer, TrainwiseError
from trainwise.checkpoint import CheckpointManager
from trainwise.runlog import RunLock, read_log

REPO = Path(__file__).resolve().parents[2]


def _data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g))


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _trainer(run_dir, **kw):
    kw.setdefault("progress", "off")
    kw.setdefault("device", "cpu")
    kw.setdefault("plot", False)
    return Trainer(run_dir=str(run_dir), **kw)


def _python(code: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, **kw)


# -- one run folder, one writer ---------------------------------------------------------------------------

_SLOW_FIT = """
    import sys, time, torch
    from torch import nn
    from torch.utils.data import Dataset
    from trainwise import Trainer

    class Slow(Dataset):
        def __len__(self):
            return 40
        def __getitem__(self, i):
            time.sleep(0.05)
            return torch.randn(8), i % 4

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4))
    Trainer(epochs=2, batch_size=8, device="cpu", progress="off", plot=False, run_dir=sys.argv[1]).fit(model, Slow())
"""


def _wait_for_lock(run_dir: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    lock = run_dir / ".trainwise.lock"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if lock.exists() and lock.read_text().strip() == str(proc.pid):
            return
        assert proc.poll() is None, "the first run ended before it took the lock"
        time.sleep(0.05)
    raise AssertionError("the first run never took the lock")


@pytest.mark.slow
def test_a_second_fit_on_a_busy_run_dir_is_refused_naming_the_holder(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    first = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_SLOW_FIT), str(run_dir)], env=env)
    try:
        _wait_for_lock(run_dir, first)
        with pytest.raises(TrainwiseError, match=rf"in use by another run \(pid {first.pid}\)"):
            _trainer(run_dir, epochs=1).fit(_mlp(), _data())
        assert first.wait(timeout=120) == 0
    finally:
        first.kill()
    records = read_log(run_dir, raw=True)
    assert [r["kind"] for r in records].count("start") == 1  # the refused run wrote nothing
    config = json.loads((run_dir / "config.json").read_text())
    assert config["trainer"]["batch_size"] == 8  # the first run's, not the refused one's
    # the lock ends with the run: the same folder can be continued now (on other data of the same size, which
    # the resume sees by its fingerprint and is told to allow)
    _trainer(run_dir, epochs=3, batch_size=8, resume="auto", resume_mismatch="allow").fit(
        nn.Sequential(nn.Linear(8, 4)), _data(40))


def test_the_lock_is_released_when_its_holder_is_killed(tmp_path):
    run_dir = tmp_path / "run"
    holder = _python(
        """
        import sys, time
        from trainwise.runlog import RunLock
        RunLock(sys.argv[1]).acquire()
        print("locked", flush=True)
        time.sleep(60)
        """.replace("sys.argv[1]", repr(str(run_dir))),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(TrainwiseError, match=f"pid {holder.pid}"):
            RunLock(run_dir).acquire()
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
    finally:
        holder.kill()
    with RunLock(run_dir) as lock:  # the operating system dropped the dead holder's lock
        assert lock.held
    result = _trainer(run_dir, epochs=1).fit(_mlp(), _data())
    assert result.stopped == "completed"


def test_the_lock_is_released_after_fit_even_when_it_fails(tmp_path):
    with pytest.raises(NonFiniteLossError):
        _trainer(tmp_path / "run", epochs=2, batch_size=16).fit(_ExplodesAt(2), _data())
    with RunLock(tmp_path / "run") as lock:
        assert lock.held


# -- bad paths and values, refused before anything is written ----------------------------------------


def test_run_dir_that_is_a_file_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("mine")
    with pytest.raises(TrainwiseError, match="is a file"):
        _trainer(path, epochs=1).fit(_mlp(), _data())
    assert path.read_text() == "mine"


def test_run_dir_under_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(TrainwiseError, match="part of its path is a file"):
        _trainer(tmp_path / "file" / "run", epochs=1).fit(_mlp(), _data())


@pytest.mark.slow
def test_unwritable_run_dir_is_refused_before_training():
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="trainwise-ro-"))  # pytest's tmp_path is private to its user
    base.chmod(0o755)
    folder = base / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    code = f"""
        import torch
        from torch import nn
        from torch.utils.data import TensorDataset
        from trainwise import Trainer, TrainwiseError
        data = TensorDataset(torch.randn(16, 8), torch.randint(0, 4, (16,)))
        try:
            Trainer(epochs=1, device="cpu", progress="off", run_dir={str(folder / "run")!r}).fit(nn.Linear(8, 4), data)
        except TrainwiseError as exc:
            print(exc)
    """
    if os.geteuid() == 0:  # root ignores permission bits: run as nobody
        if shutil.which("setpriv") is None:
            pytest.skip("needs setpriv to drop root")
        command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c"]
    else:
        command = [sys.executable, "-c"]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HOME": str(folder)}
    if os.geteuid() == 0:
        skip_unless_importable_as(command, env)
    out = subprocess.run([*command, textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert (".trainwise.lock: the folder is not writable (Permission denied); make it writable or write to another "
            "folder." in out.stdout)
    assert list(folder.iterdir()) == []
    folder.chmod(0o755)
    shutil.rmtree(base)


def skip_unless_importable_as(command: list[str], env: dict[str, str]) -> None:
    """Skip, with the reason, when the unprivileged user of ``command`` cannot run this interpreter and import
    torch and this checkout's trainwise (a clone in a private folder, such as ``mktemp -d`` makes)."""
    check = "import torch, trainwise; print(trainwise.__file__)"
    try:
        out = subprocess.run([*command, check], env=env, capture_output=True, text=True, timeout=120)
    except OSError as exc:
        pytest.skip(f"cannot start {command[0]}: {exc}")
    expected = REPO / "src" / "trainwise" / "__init__.py"
    found = out.stdout.strip().splitlines()[-1:] if out.returncode == 0 else []
    if not found or Path(found[0]).resolve() != expected.resolve():
        why = (out.stderr.strip().splitlines() or ["no error"])[-1] if out.returncode else f"it imports {found}"
        pytest.skip(f"user nobody cannot import torch and this checkout's trainwise ({why}); clone into a folder "
                    "other users can read (not a private mktemp -d) to run this test")


@pytest.mark.slow
def test_the_unprivileged_check_skips_where_the_user_cannot_read_the_interpreter(tmp_path):
    """A clone inside a private folder: the interpreter there cannot even be started by nobody, so the test
    that drops to nobody must skip with the reason instead of failing with ModuleNotFoundError."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv, as the check it tests")
    private = tmp_path / "private"  # what mktemp -d makes: 0700, owned by root
    private.mkdir(mode=0o700)
    (private / "python").symlink_to(sys.executable)
    command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(private / "python"), "-c"]
    with pytest.raises(pytest.skip.Exception, match="user nobody cannot import torch and this checkout's"):
        skip_unless_importable_as(command, {**os.environ, "PYTHONPATH": str(REPO / "src")})
    public = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c"]
    readable = all(os.stat(p).st_mode & 0o005 == 0o005 for p in [*REPO.parents, REPO] if p != Path("/"))
    if readable:  # this checkout is readable by others: the check passes and the real test runs
        skip_unless_importable_as(public, {**os.environ, "PYTHONPATH": str(REPO / "src")})


def test_read_only_file_system_is_refused(tmp_path, monkeypatch):
    import trainwise.runlog as runlog

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(runlog, "_probe_writable", read_only)
    with pytest.raises(TrainwiseError, match="on a read-only file system \\(Read-only file system\\); write to"):
        _trainer(tmp_path / "run", epochs=1).fit(_mlp(), _data())
    monkeypatch.undo()
    with RunLock(tmp_path / "run") as lock:  # a refusal does not keep the lock
        assert lock.held


@pytest.mark.parametrize("option", ["lr", "dist_timeout", "min_delta", "weight_decay", "max_grad_norm"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_are_refused(option, value):
    with pytest.raises(TrainwiseError, match=f"{option} must be a finite number"):
        Trainer(**{option: value})


def test_non_finite_learning_rate_by_pattern_is_refused():
    with pytest.raises(TrainwiseError, match="must be a finite number"):
        Trainer(lr_by_pattern={"0.*": math.nan})


def test_fit_cli_refuses_nan_override(tmp_path, capsys):
    from trainwise.cli import main

    config = tmp_path / "c.toml"
    config.write_text('[model]\nfactory = "torch.nn:Identity"\n[data]\nfactory = "builtins:list"\n')
    assert main(["fit", str(config), "lr=nan", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "lr must be a finite number" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"optimizer": lambda: torch.optim.SGD([torch.zeros(1)], lr=0.1)}, "optimizer factory .* must take one"),
        ({"optimizer": lambda a, b: None}, "optimizer factory .* must take one"),
        ({"scheduler": lambda: None}, "scheduler factory .* must take one argument, the optimizer"),
    ],
)
def test_factories_with_the_wrong_signature_are_refused_before_training(tmp_path, kwargs, match):
    with pytest.raises(TrainwiseError, match=match):
        _trainer(tmp_path / "run", epochs=1, **kwargs).fit(_mlp(), _data())
    assert not (tmp_path / "run").exists()


def test_a_factory_whose_body_raises_type_error_is_not_blamed_for_its_signature(tmp_path):
    def factory(params):
        raise TypeError("my own bug")

    with pytest.raises(TypeError, match="my own bug"):
        _trainer(tmp_path / "run", epochs=1, optimizer=factory).fit(_mlp(), _data())


@pytest.mark.parametrize("where", ["train", "val"])
def test_empty_data_is_refused_before_anything_is_written(tmp_path, where):
    empty = TensorDataset(torch.zeros(0, 8), torch.zeros(0, dtype=torch.long))
    train, val = (empty, _data()) if where == "train" else (_data(), empty)
    with pytest.raises(TrainwiseError, match="data set is empty"):
        _trainer(tmp_path / "run", epochs=1).fit(_mlp(), train, val)
    assert not (tmp_path / "run").exists()


def test_drop_last_with_a_larger_batch_is_refused(tmp_path):
    loader = DataLoader(_data(10), batch_size=16, drop_last=True)
    with pytest.raises(TrainwiseError, match="10 samples with drop_last=True"):
        _trainer(tmp_path / "run", epochs=1).fit(_mlp(), loader)


def test_absurd_worker_counts_are_refused_without_starting_any(tmp_path):
    with pytest.raises(TrainwiseError, match="num_workers=100000 is more than"):
        Trainer(num_workers=100000)
    loader = DataLoader(_data(), batch_size=16, num_workers=100000)
    with pytest.raises(TrainwiseError, match="num_workers=100000, more than"):
        _trainer(tmp_path / "run", epochs=1).fit(_mlp(), loader)


def test_demo_cli_refuses_100000_workers_in_one_line(capsys, tmp_path):
    from trainwise.cli import main

    assert main(["demo", "--workers", "100000", "--run-dir", str(tmp_path / "r"), "--json"]) == 2
    err = capsys.readouterr().err
    assert "--workers 100000 is more than" in err and len(err.strip().splitlines()) == 1  # the CLI's spelling
    assert not (tmp_path / "r").exists()


# -- a full disk or a size limit while checkpointing ---------------------------------------------------


def test_full_disk_during_a_checkpoint_names_the_file_and_the_latest_good_one(tmp_path, monkeypatch):
    real_save = torch.save
    calls = {"n": 0}

    def save_then_fill_the_disk(obj, file, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # the second checkpoint: some bytes reach the disk, then it is full
            file.write(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, file, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_then_fill_the_disk)
    run_dir = tmp_path / "run"
    with pytest.raises(TrainwiseError) as info:
        _trainer(run_dir, epochs=3, batch_size=16).fit(_mlp(), _data())
    message = str(info.value)
    first = run_dir / "checkpoints" / "ckpt-step000000004.pt"
    assert "ckpt-step000000008.pt: the disk is full (No space left on device); free some space" in message
    assert f"the latest good checkpoint is {first}" in message and "\n" not in message
    monkeypatch.setattr(torch, "save", real_save)
    assert CheckpointManager(run_dir).checkpoints() == [first]  # complete, and nothing partial beside it
    assert [p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")] == []


@pytest.mark.slow
def test_file_size_limit_during_the_first_checkpoint_is_one_line(tmp_path):
    run_dir = tmp_path / "run"
    code = f"""
        import resource, signal, torch
        from torch import nn
        from torch.utils.data import TensorDataset
        from trainwise import Trainer, TrainwiseError
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG instead of killing us
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
        data = TensorDataset(torch.randn(32, 64), torch.randint(0, 4, (32,)))
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))  # ~ 270 KB with AdamW state
        try:
            Trainer(epochs=1, batch_size=16, device="cpu", progress="off", plot=False,
                    run_dir={str(run_dir)!r}).fit(model, data)
        except TrainwiseError as exc:
            print("REFUSED", exc)
    """
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert ("ckpt-step000000002.pt: the file size limit was reached (File too large); raise the limit (ulimit -f) "
            "or write to another file system; no checkpoint was written before." in out.stdout)
    assert "Traceback" not in out.stderr
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name not in ("manifest.json", "owner.json")]


# -- resume falls back past a damaged newest checkpoint --------------------------------------------------


def _flip_a_tensor_byte(path: Path) -> None:
    import struct
    import zipfile

    with zipfile.ZipFile(path) as archive:
        member = max(archive.infolist(), key=lambda info: info.file_size)  # a tensor's bytes
    data = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack("<HH", data[member.header_offset + 26 : member.header_offset + 30])
    data[member.header_offset + 30 + name_len + extra_len + 5] ^= 0xFF
    path.write_bytes(bytes(data))


def test_resume_skips_a_damaged_newest_checkpoint_and_says_so(tmp_path, capsys):
    run_dir = tmp_path / "run"
    _trainer(run_dir, epochs=2, batch_size=16, keep_last=3, progress="lines").fit(_mlp(), _data())
    reference = _mlp(1)
    _trainer(tmp_path / "ref", epochs=3, batch_size=16, progress="off").fit(reference, _data())
    newest = run_dir / "checkpoints" / "ckpt-step000000008.pt"
    _flip_a_tensor_byte(newest)  # the zip index is intact: only the checksum tells
    capsys.readouterr()
    model = _mlp(1)
    result = _trainer(run_dir, epochs=3, batch_size=16, resume="auto", progress="lines").fit(model, _data())
    out = capsys.readouterr().out
    assert f"{newest} is damaged: its member" in out and "ckpt-step000000004.pt" in out
    assert result.steps == 12
    assert any(r["kind"] == "damaged_checkpoint" for r in read_log(run_dir))


def test_resume_from_a_named_damaged_file_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    _trainer(run_dir, epochs=1, batch_size=16).fit(_mlp(), _data())
    path = run_dir / "checkpoints" / "ckpt-step000000004.pt"
    _flip_a_tensor_byte(path)
    with pytest.raises(TrainwiseError, match="fails its checksum"):
        _trainer(tmp_path / "other", epochs=2, batch_size=16, resume=str(path)).fit(_mlp(), _data())


# -- a NaN loss leaves the model at its last finite state ------------------------------------------------


class _ExplodesAt(nn.Module):
    """Makes the loss NaN at forward ``step``; remembers its weights then (the state after step - 1)."""

    def __init__(self, step):
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.calls = 0
        self.step = step
        self.before_bad_step = None

    def forward(self, x):
        self.calls += 1
        out = self.lin(x)
        if self.calls == self.step:
            self.before_bad_step = {k: v.detach().clone() for k, v in self.state_dict().items()}
            return out * float("nan")
        return out


def test_nonfinite_stop_leaves_the_model_at_its_last_checked_finite_state(tmp_path):
    torch.manual_seed(0)
    model = _ExplodesAt(7)
    snapshots = {}

    class Recorder(torch.optim.AdamW):
        def step(self, closure=None):
            out = super().step(closure)
            snapshots[len(snapshots) + 1] = {k: v.detach().clone() for k, v in model.state_dict().items()}
            return out

    with pytest.raises(NonFiniteLossError, match="at step 7; the model is back at its state after step 6") as info:
        _trainer(tmp_path / "run", epochs=5, batch_size=16, log_every=2, optimizer=Recorder).fit(model, _data())
    assert info.value.step == 7
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(torch.equal(v, snapshots[6][k]) for k, v in model.state_dict().items())
    assert all(torch.equal(v, model.before_bad_step[k]) for k, v in model.state_dict().items())


def test_nonfinite_in_the_first_interval_returns_to_the_starting_weights(tmp_path):
    torch.manual_seed(0)
    model = _ExplodesAt(2)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with pytest.raises(NonFiniteLossError, match="state after step 0"):
        _trainer(tmp_path / "run", epochs=1, batch_size=16, log_every=50).fit(model, _data())
    assert all(torch.equal(v, start[k]) for k, v in model.state_dict().items())


def test_nonfinite_skip_keeps_train_loss_finite_and_exact(tmp_path):
    torch.manual_seed(0)
    model = _ExplodesAt(3)
    losses = []
    loss_fn = nn.functional.cross_entropy

    def recording_loss(outputs, targets):
        loss = loss_fn(outputs, targets)
        losses.append(float(loss.detach()))
        return loss

    result = _trainer(tmp_path / "run", epochs=1, batch_size=16, nonfinite="skip", loss_fn=recording_loss).fit(
        model, _data()
    )
    assert result.steps == 3  # one of the 4 windows skipped
    finite = [loss for loss in losses if math.isfinite(loss)]
    assert len(finite) == 3
    assert result.last["train_loss"] == pytest.approx(sum(finite) / 3, rel=1e-6)


def test_read_log_keeps_the_last_record_of_each_redone_step(tmp_path):
    run_dir = tmp_path / "run"
    _trainer(run_dir, epochs=2, batch_size=16, log_every=1, checkpoint_every=2).fit(_mlp(), _data())
    # as if killed after step 8's log line but with the newest checkpoint at step 6: resume redoes 7 and 8
    (run_dir / "checkpoints" / "ckpt-step000000008.pt").unlink()
    _trainer(run_dir, epochs=2, batch_size=16, log_every=1, checkpoint_every=2, resume="auto").fit(_mlp(), _data())
    raw = read_log(run_dir, raw=True)
    steps_raw = [r["step"] for r in raw if r["kind"] == "train"]
    assert steps_raw.count(7) == 2 and steps_raw.count(8) == 2
    records = read_log(run_dir)
    steps = [r["step"] for r in records if r["kind"] == "train"]
    assert steps == list(range(1, 9))
    epochs = [r["epoch"] for r in records if r["kind"] == "epoch"]
    assert epochs == [1, 2]
    resumed = [r for r in records if r["kind"] == "resumed"]
    assert resumed and resumed[0]["step"] == 6
