"""A real Hugging Face model on 2 processes with ragged shards trains exactly as on 1 process.

44 samples in per-process batches of 4 are 11 batches: rank 0 gets 6, rank 1 gets 5 and one padding batch.
Every HF attention layer reshapes its input to ``(batch, heads, -1, head_dim)``, which a batch of zero rows
cannot take (``cannot reshape tensor of 0 elements into shape [0, 2, -1, 8]``), so the Trainer pads with real
samples trained with weight 0. Both runs must finish, and the weights, the training loss and the accuracy of
2 processes must equal those of 1 process with the per-step batch of both (8), with ``drop_last`` off and on.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))  # the 2-process launcher

from hf_models import tiny_bert_classifier, token_batches
from ragged_common import init, launch

import trainwise as tw
from trainwise.data.samplers import PADDING_SAMPLES

pytest.importorskip("transformers")

SAMPLES, BATCH = 44, 4


class Texts(Dataset):
    """Dict samples as a tokenizer makes them: ids, attention mask (lengths differ), a class label."""

    def __init__(self) -> None:
        self.samples = token_batches(SAMPLES, seed=3)
        for sample in self.samples:
            sample["labels"] = torch.tensor(int(sample["input_ids"][0]) % 3)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.samples[i]


def _fit(run_dir: str, *, batch_size: int, drop_last: bool) -> dict[str, Any]:
    model = tiny_bert_classifier(seed=0)
    rows: list[int] = []  # the rows of every training forward, padding included
    model.register_forward_pre_hook(
        lambda module, args, kwargs: rows.append(len(kwargs["input_ids"])) if module.training else None,
        with_kwargs=True)
    trainer = tw.Trainer(
        epochs=1, batch_size=batch_size, drop_last=drop_last, device="cpu", precision="fp32", progress="off",
        plot=False, diagnose=False, checkpoints=False, run_dir=run_dir, seed=0, dist_timeout=60.0,
        log_every=1000, optimizer=lambda params: torch.optim.SGD(params, lr=0.5),
    )
    result = trainer.fit(model, Texts())
    return {"weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "steps": result.steps, "history": result.history, "rows": rows}


def _worker(rank: int, port: int, out: str, run_dir: str) -> None:
    init(rank, port)
    try:
        results = {drop: _fit(f"{run_dir}/drop-{drop}", batch_size=BATCH, drop_last=drop) for drop in (False, True)}
        torch.save(results, f"{out}-{rank}.pt")
        gc.collect()  # any DDP reducer goes before the process group (a teardown SIGABRT)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], dict]:
    folder = tmp_path_factory.mktemp("hf-ragged")
    launch(_worker, str(folder / "out"), str(folder / "runs"), timeout=400)
    ranks = [torch.load(folder / f"out-{rank}.pt") for rank in (0, 1)]
    single = {drop: _fit(str(folder / f"single-{drop}"), batch_size=2 * BATCH, drop_last=drop)
              for drop in (False, True)}
    return ranks, single


@pytest.mark.slow
@pytest.mark.parametrize("drop_last", [False, True], ids=["padded", "drop_last"])
def test_bert_on_two_processes_with_ragged_shards_trains_as_on_one(runs, drop_last: bool) -> None:
    ranks, single = runs
    reference = single[drop_last]
    # 44 samples: 6 steps of 8 and 4; drop_last: 5 steps of 8 (the short last batch of 4 dropped)
    assert reference["steps"] == (5 if drop_last else 6)
    assert reference["rows"] == [8] * 5 + ([] if drop_last else [4])
    # 2 processes: 11 batches of 4, rank 1 pads its 6th step with 2 real samples; drop_last: 5 each, no padding
    assert ranks[0][drop_last]["rows"] == [4] * (5 if drop_last else 6)
    assert ranks[1][drop_last]["rows"] == [4] * 5 + ([] if drop_last else [PADDING_SAMPLES])
    for rank in (0, 1):
        got = ranks[rank][drop_last]
        assert got["steps"] == reference["steps"]
        assert got["weights"].keys() == reference["weights"].keys()
        for key, value in reference["weights"].items():
            torch.testing.assert_close(got["weights"][key], value, rtol=1e-5, atol=1e-6, msg=key)
        # the padding samples count in no metric: the same loss over the same samples, the same accuracy
        (epoch,), (expected,) = got["history"], reference["history"]
        assert epoch["train_accuracy"] == expected["train_accuracy"]
        assert epoch["train_loss"] == pytest.approx(expected["train_loss"], rel=1e-6)
