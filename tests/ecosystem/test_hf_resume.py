"""A Hugging Face causal LM fed dict samples (a ``datasets.Dataset``) with token counts and accumulation,
interrupted mid-epoch and resumed, ends bit for bit where the uninterrupted run ends."""

from __future__ import annotations

import pytest
import torch
from hf_models import tiny_gpt2, token_batches

import trainwise as tw

datasets = pytest.importorskip("datasets")


def _data():
    rows = token_batches(24, seed=4)
    return datasets.Dataset.from_list([{k: v.tolist() for k, v in row.items()} for row in rows]).with_format("torch")


def _stream():
    """The same rows as a shuffled Hugging Face stream (no ``len``), told the epoch by the Trainer."""
    rows = token_batches(24, seed=4)
    table = datasets.Dataset.from_list([{k: v.tolist() for k, v in row.items()} for row in rows])
    return table.to_iterable_dataset(num_shards=4).shuffle(seed=0, buffer_size=8).with_format("torch")


def _fit(run_dir, *, interrupt_at=None, resume=None, stream=False, checkpoint_every=2):
    calls = {"n": 0}

    def build():
        model = tiny_gpt2(seed=0)
        if interrupt_at is not None:
            def count(module, args, kwargs):
                if module.training:
                    calls["n"] += 1
                    if calls["n"] == interrupt_at:
                        raise KeyboardInterrupt
            model.register_forward_pre_hook(count, with_kwargs=True)
        return model

    try:
        result = tw.Trainer(epochs=2, batch_size=4, accumulation_steps=2, count="tokens", seed=0, lr=1e-2,
                            checkpoint_every=checkpoint_every, run_dir=str(run_dir), progress="off", plot=False,
                            device="cpu", resume=resume, deterministic=True).fit(
            build, _stream() if stream else _data(), _data())
    except KeyboardInterrupt as exc:
        result = exc.result
    return result


@pytest.mark.slow
def test_interrupted_and_resumed_equals_uninterrupted(tmp_path):
    full = _fit(tmp_path / "full")
    cut = _fit(tmp_path / "cut", interrupt_at=6 + 3)  # 6 micro-batches an epoch: in epoch 2, after step 4
    assert cut.stopped == "interrupted"
    resumed = _fit(tmp_path / "cut", resume="auto")
    for (name, a), b in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert resumed.last["val_loss"] == full.last["val_loss"]


@pytest.mark.slow
def test_a_hugging_face_stream_checkpointed_every_step_resumes_bitwise(tmp_path):
    """A shuffled ``to_iterable_dataset()`` stream with ``checkpoint_every=1``, cut in its second epoch."""
    full = _fit(tmp_path / "full", stream=True, checkpoint_every=1)
    cut = _fit(tmp_path / "cut", interrupt_at=6 + 3, stream=True, checkpoint_every=1)
    assert cut.stopped == "interrupted"
    resumed = _fit(tmp_path / "cut", resume="auto", stream=True, checkpoint_every=1)
    for (name, a), b in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
