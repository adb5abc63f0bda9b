"""A file trainwise could not write is one sentence, worded by ``trainwise.files.write_failure``, whichever
writer failed: an atomic write (config.json, weights, a checkpoint), the run's log opened or appended to, the
run folder's lock. A full disk, a read-only folder (EROFS, EACCES) and a missing folder are each checked on
every writer, as a user script meets them: the operating system's error where the file is opened (or, for
the log, written), injected through ``os.open`` for the files of one folder only.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from trainwise import TrainwiseError, export, save_checkpoint
from trainwise.checkpoint import CheckpointManager, atomic_torch_save, save_training_checkpoint
from trainwise.errors import DiskWriteError
from trainwise.files import atomic_write_json, write_failure
from trainwise.run_folder import CONFIG, LOCK, LOG, checkpoint_name
from trainwise.runlog import RunLock, open_run_log

CODES = [errno.ENOSPC, errno.EROFS, errno.EACCES, errno.ENOENT]  # a full disk, read-only twice, no folder


def expected(path: Path, code: int) -> str:
    return str(write_failure(path, code, os.strerror(code)))


def fail_opens_in(folder: Path, code: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``os.open`` of any file in ``folder`` fails with ``code``, as the OS answers there."""
    real_open = os.open

    def open_(path, flags, *args, **kwargs):
        if Path(os.fsdecode(path)).parent == folder and flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(code, os.strerror(code))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)


# writer name -> (the folder it writes in, under the run folder; the write; the file its sentence names)
Writer = Callable[[Path], tuple[Path, Callable[[], object], Path]]
WRITERS: dict[str, Writer] = {
    "atomic JSON (config.json)": lambda run: (run, lambda: atomic_write_json(run / CONFIG, {"lr": 0.1}),
                                              run / CONFIG),
    "weights (torch.save)": lambda run: (run, lambda: atomic_torch_save({"w": torch.ones(3)}, run / "w.pt"),
                                         run / "w.pt"),
    "save_checkpoint": lambda run: (run, lambda: save_checkpoint(run / "c.pt", {"model": nn.Linear(2, 2)}),
                                    run / "c.pt"),
    "the run's log, opened": lambda run: (run, lambda: open_run_log(run), run / LOG),
    "the run folder's lock": lambda run: (run, lambda: RunLock(run).acquire(), run / LOCK),
    "export (torch.export)": lambda run: (run, lambda: export(nn.Linear(2, 2), torch.ones(1, 2), run / "m.pt2"),
                                          run / "m.pt2"),
}


@pytest.mark.parametrize("code", CODES, ids=errno.errorcode.get)
@pytest.mark.parametrize("writer", [name for name in WRITERS if not name.startswith("export")])
def test_every_writer_words_a_failed_open_in_the_one_sentence(tmp_path, monkeypatch, writer, code):
    run = tmp_path / "run"
    run.mkdir()
    folder, write, named = WRITERS[writer](run)
    fail_opens_in(folder, code, monkeypatch)
    with pytest.raises(DiskWriteError) as info:
        write()
    assert str(info.value) == expected(named, code)
    assert info.value.errno == code and info.value.path == named
    monkeypatch.undo()
    assert sorted(p.name for p in run.iterdir()) == []  # nothing half-written, no lock left behind


@pytest.mark.parametrize("code", CODES, ids=errno.errorcode.get)
def test_a_training_checkpoint_adds_only_the_latest_good_one(tmp_path, monkeypatch, code):
    model = nn.Linear(2, 2)
    manager = CheckpointManager(tmp_path, keep_last=2)
    save_training_checkpoint(manager, {"model": model}, step=4)
    fail_opens_in(tmp_path / "checkpoints", code, monkeypatch)
    with pytest.raises(TrainwiseError) as info:
        save_training_checkpoint(manager, {"model": model}, step=8)
    failed = expected(tmp_path / "checkpoints" / checkpoint_name(8), code).removesuffix(".")
    latest = tmp_path / "checkpoints" / checkpoint_name(4)
    assert str(info.value) == f"{failed}; the latest good checkpoint is {latest}."


@pytest.mark.parametrize("writer", ["atomic JSON (config.json)", "weights (torch.save)", "save_checkpoint",
                                    "export (torch.export)"])
def test_a_folder_that_is_not_there_is_the_same_sentence(tmp_path, writer):
    missing = tmp_path / "gone"
    _, write, named = WRITERS[writer](missing)
    with pytest.raises(DiskWriteError) as info:
        write()
    assert str(info.value) == expected(named, errno.ENOENT)
    assert not missing.exists()


@pytest.mark.skipif(not (os.path.exists("/dev/full") and os.path.isdir("/proc/self/fd")),
                    reason="needs /dev/full and /proc to fill the disk under an open log")
def test_a_full_disk_under_the_open_log_is_the_same_sentence(tmp_path):
    log = open_run_log(tmp_path)
    try:
        log.write({"kind": "start"})
        fd = next(int(n) for n in os.listdir("/proc/self/fd")
                  if os.path.realpath(f"/proc/self/fd/{n}") == str((tmp_path / LOG).resolve()))
        full = os.open("/dev/full", os.O_WRONLY)
        os.dup2(full, fd)  # every write to the log's descriptor now meets a full disk, as the kernel says it
        os.close(full)
        with pytest.raises(DiskWriteError) as info:
            log.write({"kind": "train", "step": 1, "loss": 0.5})
        assert str(info.value) == expected(tmp_path / LOG, errno.ENOSPC)
    finally:
        log.close()
