"""A loss without a target (contrastive, self-supervised): ``split_batch=lambda batch: (batch, None)``, samples
counted from the inputs, the loss from ``loss_fn(outputs, None)``; accumulation said to split in-batch
negatives."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import trainwise as tw
from trainwise.errors import TrainwiseError


class PairEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(6, 4)

    def forward(self, anchor, positive):
        return {"logits": self.net(anchor) @ self.net(positive).T}  # similarity of every pair in the batch


def contrastive(outputs, targets):
    assert targets is None
    return nn.functional.cross_entropy(outputs, torch.arange(outputs.shape[0]))  # in-batch negatives


def _pairs(n=32):
    g = torch.Generator().manual_seed(1)
    anchor = torch.randn(n, 6, generator=g)
    return [{"anchor": a, "positive": a + 0.1 * torch.randn(6, generator=g)} for a in anchor]


def _trainer(tmp_path, **options):
    return tw.Trainer(epochs=1, lr=1e-2, seed=0, progress="off", checkpoints=False, plot=False, device="cpu",
                      run_dir=str(tmp_path / "run"), split_batch=lambda batch: (batch, None), loss_fn=contrastive,
                      **options)


def test_samples_are_counted_from_the_inputs_and_the_loss_is_the_loss_fns(tmp_path):
    data = _pairs()
    result = _trainer(tmp_path, batch_size=8).fit(PairEncoder(), data, data)
    assert "train_accuracy" not in result.last
    model = result.model.eval()
    with torch.no_grad():  # val_loss: the mean over the four batches of 8, each weighted by its 8 samples
        losses = [contrastive(model(torch.stack([d["anchor"] for d in data[i:i + 8]]),
                                    torch.stack([d["positive"] for d in data[i:i + 8]]))["logits"], None)
                  for i in range(0, 32, 8)]
    assert result.last["val_loss"] == pytest.approx(float(torch.stack(losses).mean()), rel=1e-6)


def test_the_primitive_counts_a_batch_without_target_from_its_inputs():
    batch = {"anchor": torch.randn(5, 6), "positive": torch.randn(5, 6)}
    out = tw.forward_micro_batch(PairEncoder(), batch, split=lambda b: (b, None), loss_fn=contrastive)
    assert out.count == 5 and out.targets is None


def test_accumulation_says_that_in_batch_negatives_are_per_micro_batch(tmp_path):
    with pytest.warns(UserWarning, match="each step accumulates 4 micro-batches.*in-batch negatives"):
        _trainer(tmp_path, batch_size=4, accumulation_steps=4).fit(PairEncoder(), _pairs(16))


def test_no_target_and_no_loss_fn_is_one_sentence(tmp_path):
    trainer = tw.Trainer(epochs=1, progress="off", checkpoints=False, plot=False, device="cpu",
                         run_dir=str(tmp_path / "run"), split_batch=lambda batch: (batch, None))
    with pytest.raises(TrainwiseError, match="a batch without a target needs a loss: pass loss_fn="):
        trainer.fit(lambda: nn.Linear(6, 3), [torch.randn(4, 6)])


def test_token_counts_without_a_target_are_refused(tmp_path):
    with pytest.raises(TrainwiseError, match="count='tokens' counts target tokens, and this batch has no target"):
        _trainer(tmp_path, batch_size=8, count="tokens").fit(PairEncoder(), _pairs())


def test_a_dict_batch_without_a_target_names_the_pattern():
    with pytest.raises(TrainwiseError, match=r"no target.*split_batch=lambda batch: \(batch, None\) with loss_fn"):
        tw.data.split_batch({"anchor": torch.zeros(2, 6), "positive": torch.zeros(2, 6)})
    with pytest.raises(TrainwiseError, match=r"cannot count the samples in a str.*\(batch, None\)"):
        tw.data.count_items("not a target")
