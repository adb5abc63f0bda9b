"""batch_size="auto": the micro-batch that fits is found by halving on out-of-memory errors, a window that runs
out of memory is redone from its start, and the result equals a run that never ran out of memory (allclose
1e-6, fp32) with every sample counted once. Out of memory is injected with a test double raising
torch.OutOfMemoryError above a micro-batch size, as CUDA would."""

from __future__ import annotations

import gc
import json
import os
import socket
import weakref
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from trainwise import GradientAccumulator, Trainer, TrainwiseError, read_log
from trainwise.oom import AdaptiveMicroBatches, is_out_of_memory


def _data(n=200):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, (x[:, 0] + x[:, 1] > 0).long())


def _oom(size):
    return torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {size} MiB")


class FitsUpTo(nn.Module):
    """Runs out of memory on a training micro-batch above ``limit`` samples (from optimizer step ``after``)."""

    def __init__(self, limit, after=0):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        self.limit, self.after, self.step, self.sizes = limit, after, 0, []

    def forward(self, x):
        if self.training:
            self.sizes.append(x.shape[0])
            if self.step >= self.after and x.shape[0] > self.limit:
                raise _oom(x.shape[0])
        return self.net(x)


def _fit(run_dir, model, **options):
    defaults = dict(epochs=2, batch_size="auto", effective_batch=64, run_dir=str(run_dir), progress="off", seed=0,
                    plot=False, callbacks=[TellStep(model)])
    return Trainer(**{**defaults, **options}).fit(lambda: model, _data(), _data(64))


class TellStep:
    """Tell the test double which optimizer step it is in (its out-of-memory may start at a chosen step)."""

    def __init__(self, model):
        self.model = model

    def on_step_end(self, state):
        self.model.step = state.step


def _built(limit, after=0):
    torch.manual_seed(0)
    return FitsUpTo(limit, after)


def _assert_same_weights(a, b):
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6, msg=name)


def test_the_first_window_finds_the_micro_batch_and_training_equals_the_full_batch(tmp_path):
    reference = _built(limit=10**6)
    full = _fit(tmp_path / "full", reference, batch_size=64)  # the effective batch in one micro-batch
    model = _built(limit=20)
    result = _fit(tmp_path / "auto", model)
    assert model.sizes[:3] == [64, 32, 16]  # halved twice in step 1, then 16 x 4 from the window's start
    _assert_same_weights(model, reference)
    assert result.steps == full.steps == 8  # 200 samples: windows of 64, 64, 64, 8 an epoch
    for ours, theirs in zip(result.history, full.history):
        assert ours["train_loss"] == pytest.approx(theirs["train_loss"], rel=1e-6)
        assert ours["train_accuracy"] == theirs["train_accuracy"]  # every sample counted once
    ooms = [r for r in read_log(result.run_dir) if r["kind"] == "oom"]
    assert [r["message"] for r in ooms] == [
        "OOM at micro-batch 64 in step 1: continuing with 32 x 2, effective batch 64 unchanged.",
        "OOM at micro-batch 32 in step 1: continuing with 16 x 4, effective batch 64 unchanged.",
    ]


def test_an_oom_mid_training_redoes_its_window_at_half_the_size(tmp_path):
    reference = _built(limit=10**6)
    _fit(tmp_path / "full", reference, batch_size=64)
    model = _built(limit=40, after=5)  # fits at 64 until step 6 (epoch 2), then needs 32
    result = _fit(tmp_path / "auto", model)
    _assert_same_weights(model, reference)
    ooms = [r for r in read_log(result.run_dir) if r["kind"] == "oom"]
    assert [(r["step"], r["micro_batch"]) for r in ooms] == [(6, 32)]
    # step 5 fitted 64; step 6 tried 64 (out of memory: discarded), then 32 + 32; later windows in 32s
    assert model.sizes[4:] == [64, 64, 32, 32, 32, 32, 8]
    samples = [r for r in read_log(result.run_dir) if r["kind"] == "epoch"]
    assert len(samples) == 2 and result.history[1]["train_accuracy"] * 200 == pytest.approx(
        round(result.history[1]["train_accuracy"] * 200))


def test_the_checkpoint_keeps_the_size_that_fits_and_a_resume_starts_from_it(tmp_path):
    model = _built(limit=20)
    _fit(tmp_path / "run", model, epochs=1)
    resumed = _built(limit=20)
    result = _fit(tmp_path / "run", resumed, resume="auto")
    assert resumed.sizes and max(resumed.sizes) == 16  # never tried 64 or 32 again
    after = [r["kind"] for r in read_log(result.run_dir)]
    assert after.index("resumed") > max(i for i, kind in enumerate(after) if kind == "oom")


def test_out_of_memory_at_one_sample_is_one_sentence(tmp_path):
    with pytest.raises(TrainwiseError) as info:
        _fit(tmp_path / "run", _built(limit=0))
    assert str(info.value) == (
        "out of memory at micro-batch 1 in step 1: even one sample does not fit; use a smaller model, "
        "precision='bf16', activation checkpointing (torch.utils.checkpoint) or fewer sequence tokens per sample."
    )


def test_every_other_error_propagates_unchanged(tmp_path):
    class Broken(FitsUpTo):
        def forward(self, x):
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (64x8 and 7x16)")

    torch.manual_seed(0)
    model = Broken(10**6)
    with pytest.raises(RuntimeError, match=r"^mat1 and mat2 shapes cannot be multiplied"):
        _fit(tmp_path / "run", model)
    assert not any(r["kind"] == "oom" for r in read_log(tmp_path / "run"))


def test_what_counts_as_out_of_memory():
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory."))
    assert is_out_of_memory(RuntimeError("MPS backend out of memory (MPS allocated: 8.00 GB, other allocations"))
    assert not is_out_of_memory(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not is_out_of_memory(MemoryError())  # host memory: a smaller micro-batch is not the answer
    assert not is_out_of_memory(ValueError("out of memory"))


class Tokens(Dataset):
    """Hugging Face style samples: dicts with input_ids, attention_mask and labels."""

    def __len__(self):
        return 96

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        length = 3 + i % 5
        ids = torch.zeros(8, dtype=torch.long)
        ids[:length] = torch.randint(1, 50, (length,), generator=g)
        labels = torch.where(torch.arange(8) < length, ids, torch.tensor(-100))
        return {"input_ids": ids, "attention_mask": (torch.arange(8) < length).long(), "labels": labels}


class TinyLM(nn.Module):
    """Computes its own token loss from labels, as transformers models do; out of memory above ``limit`` rows."""

    def __init__(self, limit):
        super().__init__()
        self.embed, self.head = nn.Embedding(50, 16), nn.Linear(16, 50)
        self.sizes, self.limit = [], limit

    def forward(self, input_ids, attention_mask, labels=None):
        if self.training:
            self.sizes.append(input_ids.shape[0])
            if input_ids.shape[0] > self.limit:
                raise _oom(input_ids.shape[0])
        logits = self.head(self.embed(input_ids) * attention_mask.unsqueeze(-1))
        loss = F.cross_entropy(logits.reshape(-1, 50), labels.reshape(-1), ignore_index=-100)
        return {"loss": loss, "logits": logits}


def test_dict_batches_with_a_model_loss_are_split_by_rows_and_count_tokens_exactly(tmp_path):
    def run(name, limit, **options):
        torch.manual_seed(0)
        model = TinyLM(limit)
        result = Trainer(epochs=1, effective_batch=32, count="tokens", run_dir=str(tmp_path / name),
                         progress="off", plot=False, seed=0, **options).fit(lambda: model, Tokens())
        return model, result

    reference, full = run("full", 10**6, batch_size=32)
    model, auto = run("auto", 8, batch_size="auto")
    assert model.sizes[:3] == [32, 16, 8] and set(model.sizes[3:]) == {8}
    _assert_same_weights(model, reference)
    assert auto.history[0]["train_loss"] == pytest.approx(full.history[0]["train_loss"], rel=1e-6)


def test_a_loader_of_another_batch_size_is_refused(tmp_path):
    loader = DataLoader(_data(), batch_size=32)
    with pytest.raises(TrainwiseError, match=r"yields batches of 32, not effective_batch=64; build it with "
                                             r"batch_size=64, or pass the Dataset"):
        Trainer(batch_size="auto", effective_batch=64, run_dir=str(tmp_path / "r"), progress="off").fit(
            nn.Linear(8, 2), loader)


def test_batch_size_auto_needs_the_effective_batch():
    with pytest.raises(TrainwiseError, match="batch_size='auto' needs effective_batch"):
        Trainer(batch_size="auto")


def test_the_primitive_in_a_hand_written_loop_equals_the_full_batch():
    data = _data(128)

    def train(micro_size, limit):
        torch.manual_seed(0)
        model = FitsUpTo(limit)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        accumulator = GradientAccumulator(optimizer)
        micro = AdaptiveMicroBatches(micro_size)
        for batch in DataLoader(data, batch_size=64):
            def step(part, last):
                x, y = part
                accumulator.backward(F.cross_entropy(model(x), y), count=len(y))

            micro.run(batch, step, discard=accumulator.discard_window)
            accumulator.step()
        return model, micro.size

    reference, _ = train(64, 10**6)
    model, size = train(64, 10)
    assert size == 8
    _assert_same_weights(model, reference)


def _ddp_worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        results = {}
        for name, limit, batch_size in (("full", 10**6, 32), ("auto", 10**6 if rank == 0 else 20, "auto")):
            torch.manual_seed(0)
            model = FitsUpTo(limit)  # only rank 1 runs out of memory
            Trainer(epochs=1, batch_size=batch_size, effective_batch=32, run_dir=f"{out}/{name}", progress="off",
                    plot=False, seed=0, device="cpu", dist_timeout=60,
                    optimizer=lambda params: torch.optim.SGD(params, lr=0.5)).fit(lambda m=model: m, _data(200))
            results[name] = {"weights": [p.detach().tolist() for p in model.parameters()], "sizes": model.sizes}
        Path(out, f"rank{rank}.json").write_text(json.dumps(results))
        gc.collect()  # a DDP wrapper in a reference cycle goes before the process group (a teardown SIGABRT)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_under_ddp_every_rank_switches_together_when_one_runs_out_of_memory(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.spawn(_ddp_worker, args=(port, str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    # rank 1 ran out of memory at 32 in step 1; rank 0 had fitted 32, yet both redid the window at 16
    assert ranks[0]["auto"]["sizes"][:3] == ranks[1]["auto"]["sizes"][:3] == [32, 16, 16]
    assert max(ranks[0]["auto"]["sizes"][3:]) == max(ranks[1]["auto"]["sizes"][3:]) == 16
    for rank in ranks:  # the replicas stay identical and equal the run that never ran out of memory
        for ours, theirs in zip(rank["auto"]["weights"], ranks[0]["full"]["weights"]):
            torch.testing.assert_close(torch.tensor(ours), torch.tensor(theirs), rtol=1e-6, atol=1e-6)



class _Cycle:
    """Activations in a reference cycle, as a hook or a closure over the model can leave them."""

    def __init__(self, activations: torch.Tensor) -> None:
        self.activations, self.me = activations, self


class CycleThenOutOfMemory(nn.Module):
    """Above ``limit`` samples, leaves 16 MiB of activations in a reference cycle and runs out of memory;
    ``held`` records, at every forward, whether a failed micro-batch's cycle was still alive."""

    def __init__(self, limit: int, device: str = "cpu") -> None:
        super().__init__()
        self.net = nn.Linear(8, 2).to(device)
        self.limit, self.cycles, self.held = limit, [], []

    def forward(self, x):
        self.held.append(any(cycle() is not None for cycle in self.cycles))
        if x.shape[0] > self.limit:
            self.cycles.append(weakref.ref(_Cycle(torch.ones(1 << 22, device=x.device))))
            raise _oom(x.shape[0])
        return self.net(x)


def _one_window(model: nn.Module, device: str) -> int:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    accumulator = GradientAccumulator(optimizer)
    micro = AdaptiveMicroBatches(64)
    batch = (torch.randn(64, 8, device=device), torch.randint(0, 2, (64,), device=device))

    def train(part, last):
        x, y = part
        accumulator.backward(F.cross_entropy(model(x), y), count=len(y))

    size = micro.run(batch, train, discard=accumulator.discard_window)
    accumulator.step()
    return size


def test_no_full_collection_when_no_accelerator_memory_is_in_use(monkeypatch):
    """Host memory is not what runs out (CUDA's and MPS's is): no full collection, 0.4 s with a big heap."""
    if torch.cuda.is_initialized() or torch.backends.mps.is_available():  # asked now: an earlier test may use CUDA
        pytest.skip("accelerator memory is in use in this process")
    collections = []
    real = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *args: collections.append(args) or real(*args))
    assert _one_window(CycleThenOutOfMemory(limit=16), "cpu") == 16
    assert collections == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_a_failed_windows_cycles_are_freed_before_it_is_redone():
    torch.cuda.synchronize()
    model = CycleThenOutOfMemory(limit=16, device="cuda")
    baseline = torch.cuda.memory_allocated()
    assert _one_window(model, "cuda") == 16
    assert len(model.cycles) == 2 and len(model.held) == 6  # 64 and 32 fail, then 4 micro-batches of 16
    assert not any(model.held), model.held  # each retry started with the failed micro-batch's 16 MiB freed
    assert torch.cuda.memory_allocated() - baseline < 1 << 22
