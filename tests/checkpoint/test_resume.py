"""Exact resume: the data order continues mid-epoch, and a killed-and-resumed run ends bitwise identical."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from trainwise.data import ResumableLoader, seeded_loader

HERE = Path(__file__).parent


class Indices(Dataset):
    """Returns each sample's index, so a batch shows exactly which samples it holds."""

    def __len__(self) -> int:
        return 21

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(index)


def epochs(loader: ResumableLoader, count: int) -> list[list[list[int]]]:
    return [[batch.tolist() for batch in loader] for _ in range(count)]


def round_trip(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_resumes_mid_epoch_without_skipping_or_repeating(workers):
    make = lambda: ResumableLoader(seeded_loader(Indices(), batch_size=4, seed=7, num_workers=workers))  # noqa: E731
    expected = epochs(make(), 3)  # 6 batches per epoch (the last one short), reshuffled each epoch
    assert expected[0] != expected[1]
    positions = range(len(expected[1]) + 1) if workers == 0 else [2]
    for done in positions:  # interrupted after `done` batches of the second epoch
        first = make()
        seen = epochs(first, 1)
        iterator = iter(first)
        seen_now = [next(iterator).tolist() for _ in range(done)]
        state = round_trip(first.state_dict())  # what a checkpoint would hold
        del iterator, first
        resumed = make()  # a fresh process would build the same loader
        resumed.load_state_dict(state)
        assert resumed.resume_offset == done
        rest = [batch.tolist() for batch in resumed]
        assert [*seen, seen_now + rest] == expected[:2], f"resumed after {done} batches"
        assert epochs(resumed, 1) == expected[2:]  # and the next epoch is the uninterrupted one
        flat = sorted(i for batch in seen_now + rest for i in batch)
        assert flat == list(range(21))


def test_loader_state_between_epochs():
    make = lambda: ResumableLoader(seeded_loader(Indices(), batch_size=5, seed=3))  # noqa: E731
    expected = epochs(make(), 3)
    first = make()
    epochs(first, 1)
    state = round_trip(first.state_dict())
    resumed = make()
    resumed.load_state_dict(state)
    assert resumed.resume_offset == 0
    assert epochs(resumed, 2) == expected[1:]


def test_plain_dataloader_drawing_from_the_global_rng():
    # DataLoader(shuffle=True) without generators takes its order from torch's global RNG
    def make():
        return ResumableLoader(DataLoader(Indices(), batch_size=4, shuffle=True))

    torch.manual_seed(11)
    loader = make()
    epochs(loader, 1)
    iterator = iter(loader)
    head = [next(iterator).tolist() for _ in range(3)]
    state, rng = round_trip(loader.state_dict()), torch.get_rng_state()  # the step-boundary checkpoint
    tail = [batch.tolist() for batch in iterator]
    after = torch.rand(2)

    torch.manual_seed(0)  # a fresh process
    resumed = make()
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)  # load_checkpoint restores the RNG
    assert [batch.tolist() for batch in resumed] == tail
    assert torch.equal(torch.rand(2), after)  # resuming the data order did not disturb the global RNG
    assert sorted(i for b in head + tail for i in b) == list(range(21))


def test_iterable_of_batches_is_resumed_by_reading_past_the_seen_batches():
    batches = [torch.full((2,), i) for i in range(5)]
    assert not hasattr(ResumableLoader(iter(batches)), "__len__")  # no length where the loader has none
    loader = ResumableLoader(batches)
    assert len(loader) == 5 and isinstance(loader, ResumableLoader)
    iterator = iter(loader)
    next(iterator), next(iterator)
    resumed = ResumableLoader(batches)
    resumed.load_state_dict(round_trip(loader.state_dict()))
    assert [int(b[0]) for b in resumed] == [2, 3, 4]


def test_position_beyond_the_epoch_is_an_error():
    from trainwise.errors import TrainwiseError

    loader = ResumableLoader(seeded_loader(TensorDataset(torch.zeros(8)), batch_size=4, seed=0))
    with pytest.raises(TrainwiseError, match="has only 2"):
        loader.load_state_dict({"epoch_start": {"generators": [], "torch": None}, "batches_done": 5})


def _run(out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(HERE / "resume_loop.py"), str(out), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _final(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "final.pt", weights_only=True)


@pytest.mark.slow
def test_killed_and_resumed_run_is_bitwise_identical(tmp_path):
    """Hand-written loop (seeded_loader, GradientAccumulator, dropout, AdamW, StepLR, CheckpointManager).

    Uninterrupted runs with num_workers 0 and 2 (the 0-worker run keeps every checkpoint). A 2-worker run
    SIGKILLed one micro-batch after the checkpoint of optimizer step 6 (batch 4 of 7 of the second epoch),
    resumed with ``load_latest`` in a fresh process; 0-worker runs resumed in fresh processes from the
    uninterrupted run's own checkpoints of step 6 (mid-epoch) and step 4 (the end of the first epoch), by
    explicit path. Every final weight must be bitwise equal to the uninterrupted run's. Two parallel phases.
    """
    phase1 = {
        "u0": _run(tmp_path / "u0", "--workers", "0", "--keep", "20"),
        "u2": _run(tmp_path / "u2", "--workers", "2"),
        "k2": _run(tmp_path / "k2", "--workers", "2", "--kill-after-step", "6"),
    }
    for name, proc in phase1.items():
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == (-9 if name == "k2" else 0), f"{name}: {err[-2000:]}"
    checkpoints = tmp_path / "u0" / "checkpoints"
    phase2 = {
        "k2": (_run(tmp_path / "k2", "--workers", "2", "--resume"), "ckpt-step000000006.pt at epoch 1, batch 4"),
        "r0-mid": (
            _run(tmp_path / "r0-mid", "--resume-from", str(checkpoints / "ckpt-step000000006.pt")),
            "ckpt-step000000006.pt at epoch 1, batch 4",
        ),
        "r0-end": (
            _run(tmp_path / "r0-end", "--resume-from", str(checkpoints / "ckpt-step000000004.pt")),
            "ckpt-step000000004.pt at epoch 0, batch 7",
        ),
    }
    for name, (proc, expected) in phase2.items():
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, f"{name}: {err[-2000:]}"
        assert f"resumed from {expected}" in out, out
    reference = _final(tmp_path / "u0")
    for name in ("u2", "k2", "r0-mid", "r0-end"):
        final = _final(tmp_path / name)
        assert final.keys() == reference.keys()
        for key in reference:
            assert torch.equal(reference[key], final[key]), f"{name}: {key} differs"
