"""Token-weighted accumulation and validation loss with real Hugging Face language models.

A causal LM shifts its labels inside ``forward`` (position t predicts label t+1), so a sequence's counted
tokens are ``labels[:, 1:] != -100``; a masked LM counts ``labels != -100``. The accumulated gradient must
equal the full batch's gradient of the model's own loss, and ``val_loss`` the model's own loss over the
whole validation set, to float precision.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hf_models import tiny_bert_mlm, tiny_gpt2, tiny_llama, token_batches

import trainwise as tw

pytest.importorskip("transformers")


def _stack(samples):
    return {key: torch.stack([s[key] for s in samples]) for key in samples[0]}


def _mlm_samples(n, seed=0):
    samples = token_batches(n, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    for s in samples:  # a masked LM predicts only some tokens: the rest are -100
        keep = torch.rand(s["labels"].shape, generator=g) < 0.3
        s["labels"] = torch.where(keep, s["labels"], torch.full_like(s["labels"], -100))
    return samples


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _full_batch_gradient(model, samples):
    model.zero_grad()
    model(**_stack(samples)).loss.backward()  # the model's own loss over the whole batch: token-weighted
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def _accumulated_gradient(model, samples, micro=4, **count):
    """One SGD step of lr 1 through forward_micro_batch + GradientAccumulator: the step is minus the gradient
    (``count`` as given, else the default)."""
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    accumulator = tw.GradientAccumulator(optimizer, steps=len(samples) // micro)
    for start in range(0, len(samples), micro):
        out = tw.forward_micro_batch(model, _stack(samples[start:start + micro]), **count)
        if out.loss is None:
            accumulator.backward_empty(out.outputs)
        else:
            accumulator.backward(out.loss, count=out.count, reduction=out.reduction)
    assert accumulator.step()
    return torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters())])


@pytest.mark.parametrize("count", [{"count": "tokens"}, {}], ids=["tokens", "default"])
@pytest.mark.parametrize("build, make", [(tiny_gpt2, token_batches), (tiny_llama, token_batches),
                                         (tiny_bert_mlm, _mlm_samples)], ids=["gpt2", "llama", "bert-mlm"])
def test_accumulated_gradient_equals_the_full_batch_gradient_of_the_models_own_loss(build, make, count):
    model = build()
    samples = make(16)
    full = _full_batch_gradient(copy.deepcopy(model), samples)
    accumulated = _accumulated_gradient(model, samples, **count)
    assert _relative(accumulated, full) <= 1e-6


def test_a_causal_lm_counts_the_shifted_labels():
    model = tiny_gpt2()
    batch = _stack(token_batches(4))
    out = tw.forward_micro_batch(model, batch, count="tokens")
    assert out.count == int((batch["labels"][:, 1:] != -100).sum())
    assert out.count < int((batch["labels"] != -100).sum())


def test_a_sequence_whose_only_label_is_its_first_token_counts_nothing_for_a_causal_lm():
    model = tiny_gpt2()
    batch = _stack(token_batches(2))
    batch["labels"][:, 1:] = -100  # position 0 is never predicted by a causal LM: 0 tokens, not 2
    out = tw.forward_micro_batch(model, batch, count="tokens")
    assert out.count == 0 and out.loss is None


@pytest.mark.parametrize("count", [{"count": "tokens"}, {}], ids=["tokens", "default"])
def test_trainer_val_loss_is_the_models_own_token_weighted_loss(count):
    train, val = token_batches(16, seed=0), token_batches(12, seed=1)
    result = tw.Trainer(epochs=1, lr=1e-3, batch_size=4, accumulation_steps=2, **count, seed=0,
                        progress="off", checkpoints=False, plot=False, guards="off", device="cpu",
                        precision="fp32", run_dir=None).fit(lambda: tiny_gpt2(seed=0), train, val)
    model = result.model.eval()
    with torch.no_grad():
        expected = float(model(**_stack(val)).loss)  # the whole validation set in one batch
    assert result.last["val_loss"] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("count", [{"count": "tokens"}, {}], ids=["tokens", "default"])
@pytest.mark.parametrize("build", [tiny_gpt2, tiny_llama], ids=["gpt2", "llama"])
def test_trainer_accumulation_equals_one_full_batch_step_for_a_causal_lm(build, count):
    samples = token_batches(48, seed=3)
    common = dict(epochs=1, lr=1e-2, **count, seed=0, progress="off", checkpoints=False, plot=False,
                  guards="off", device="cpu", precision="fp32", weight_decay=0.0,
                  optimizer=lambda params: torch.optim.SGD(params, lr=1e-2))
    accumulated = tw.Trainer(batch_size=4, accumulation_steps=12, **common).fit(lambda: build(seed=0), samples)
    full = tw.Trainer(batch_size=48, accumulation_steps=1, **common).fit(lambda: build(seed=0), samples)
    a = torch.cat([p.detach().flatten() for p in accumulated.model.parameters()])
    b = torch.cat([p.detach().flatten() for p in full.model.parameters()])
    start = torch.cat([p.detach().flatten() for p in build(seed=0).parameters()])
    assert _relative(a - start, b - start) <= 1e-5


class _OwnLoss(torch.nn.Module):
    """A model of the user's own that returns a loss: shifted like a causal LM, or with something added."""

    def __init__(self, *, shift: int, extra: float = 0.0):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = torch.nn.Embedding(61, 8), torch.nn.Linear(8, 61)
        self.shift, self.extra = shift, extra

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits = self.head(self.embed(input_ids))
        cut = logits[:, : logits.shape[1] - self.shift] if self.shift else logits
        loss = torch.nn.functional.cross_entropy(cut.flatten(0, 1), labels[:, self.shift:].flatten())
        return {"loss": loss + self.extra * logits.square().mean(), "logits": logits}


@pytest.mark.parametrize("shift", [0, 1])
def test_the_label_shift_of_any_models_own_loss_is_measured(shift):
    model = _OwnLoss(shift=shift)
    batch = _stack(token_batches(4))
    out = tw.forward_micro_batch(model, batch, count="tokens")
    assert out.count == int((batch["labels"][:, shift:] != -100).sum())


def test_a_models_loss_that_trainwise_cannot_count_is_refused_naming_loss_fn():
    model = _OwnLoss(shift=1, extra=0.5)  # an auxiliary term: not a mean over any count of tokens
    with pytest.raises(tw.TrainwiseError, match=r"count='tokens'.*cannot know what it averages over; pass loss_fn="):
        tw.forward_micro_batch(model, _stack(token_batches(4)), count="tokens")


def test_the_default_count_is_chosen_from_the_first_batch_and_recorded_with_its_reason(tmp_path):
    import json

    result = tw.Trainer(epochs=1, lr=1e-3, batch_size=4, seed=0, progress="off", plot=False, device="cpu",
                        run_dir=str(tmp_path / "run")).fit(lambda: tiny_llama(seed=0), token_batches(8, seed=0))
    config = json.loads((result.run_dir / "config.json").read_text())
    assert config["count"] == "tokens" and "shifted by one" in config["count_reason"]
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["count"] for r in records if r["kind"] == "count"] == ["tokens"]


def test_the_default_count_is_samples_for_one_label_per_sample_and_for_a_loss_fn_of_yours():
    from hf_models import tiny_bert_classifier

    classifier = tiny_bert_classifier()
    batch = {"input_ids": torch.randint(1, 50, (4, 9)), "attention_mask": torch.ones(4, 9, dtype=torch.long),
             "labels": torch.tensor([0, 1, 2, 0])}
    assert tw.forward_micro_batch(classifier, batch).count == 4
    lm = tiny_gpt2()
    tokens = _stack(token_batches(4))
    out = tw.forward_micro_batch(lm, tokens, loss_fn=lambda logits, labels: logits.float().mean())
    assert out.count == 4
    from trainwise.data.batches import count_choice

    assert count_choice(classifier)[0] == "samples" and count_choice(lm)[0] == "samples"
    assert "loss_fn" in count_choice(lm)[1]


def test_a_models_own_loss_that_is_no_token_mean_is_counted_by_sample_by_default():
    model = _OwnLoss(shift=1, extra=0.5)  # a causal loss with something added: not a mean over tokens
    out = tw.forward_micro_batch(model, _stack(token_batches(4)))
    assert out.count == 4


def test_a_router_loss_is_no_token_mean_whatever_the_model_declares():
    """Mixtral with output_router_logits adds a router term to its causal loss: its declared loss type says
    causal LM, but the loss matches no token mean, so count='tokens' is refused naming loss_fn= and the default
    counts samples, saying why (before, the declared shift was taken: 7e-4 off the full batch)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.MixtralConfig(vocab_size=61, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=2, num_local_experts=4,
                                        num_experts_per_tok=2, max_position_embeddings=32,
                                        output_router_logits=True, router_aux_loss_coef=0.02)
    model = transformers.MixtralForCausalLM(config)
    batch = _stack(token_batches(4))
    with pytest.raises(tw.TrainwiseError, match=r"count='tokens'.*cannot know what it averages over; pass loss_fn="):
        tw.forward_micro_batch(model, batch, count="tokens")
    from trainwise.data.batches import _COUNT_CHOICE, _LABEL_SHIFT

    _LABEL_SHIFT.pop(model, None), _COUNT_CHOICE.pop(model, None)
    out = tw.forward_micro_batch(model, batch)
    assert out.count == 4
    from trainwise.data import count_choice

    assert count_choice(model)[0] == "samples" and "not a mean cross-entropy" in count_choice(model)[1]
