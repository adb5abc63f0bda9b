"""A peft LoRA model trains on the base model's own causal loss, with or without ``task_type``.

Without ``task_type`` ``get_peft_model`` returns a ``PeftModel`` whose ``forward(*args, **kwargs)`` names no
``labels``; the labels must still reach the model (``**kwargs`` accepts them), or cross-entropy on the
unshifted logits would train every position to predict its own input token.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from hf_models import tiny_gpt2, token_batches

import trainwise as tw

peft = pytest.importorskip("peft")


def _stack(samples):
    return {key: torch.stack([s[key] for s in samples]) for key in samples[0]}


def _lora(task_type):
    options = {"task_type": task_type} if task_type else {}
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], lora_dropout=0.0, **options)
    return peft.get_peft_model(tiny_gpt2(seed=0), config)


@pytest.mark.parametrize("task_type", [None, "CAUSAL_LM"])
def test_the_loss_is_the_models_own_causal_loss(task_type):
    model = _lora(task_type)
    batch = _stack(token_batches(4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "labels equal to the inputs" warning: the model's loss is used
        out = tw.forward_micro_batch(model, batch, count="tokens")
    assert out.model_loss
    with torch.no_grad():
        expected = model(**batch).loss
    assert float(out.loss) == pytest.approx(float(expected), rel=1e-6)
    assert out.count == int((batch["labels"][:, 1:] != -100).sum())


@pytest.mark.parametrize("task_type", [None, "CAUSAL_LM"])
def test_trainer_train_loss_is_the_causal_loss_and_only_the_adapter_trains(tmp_path, task_type):
    samples = token_batches(16, seed=2)
    model = _lora(task_type)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    with torch.no_grad():
        expected = float(model(**_stack(samples)).loss)  # token-weighted over the epoch, weights unchanged
    result = tw.Trainer(epochs=1, batch_size=4, count="tokens", seed=0, progress="off", checkpoints=False,
                        plot=False, device="cpu", run_dir=str(tmp_path / "run"),
                        optimizer=lambda params: torch.optim.SGD(params, lr=0.0)).fit(model, samples)
    assert result.last["train_loss"] == pytest.approx(expected, rel=1e-6)
    changed = tw.Trainer(epochs=1, batch_size=4, count="tokens", seed=0, progress="off", checkpoints=False,
                         plot=False, device="cpu", run_dir=str(tmp_path / "run2"), lr=1e-2).fit(model, samples)
    moved = [name for name, p in changed.model.named_parameters() if not torch.equal(p, before[name])]
    assert moved and all("lora_" in name for name in moved)


def test_cross_entropy_on_a_causal_lm_without_its_shift_is_said_once():
    """A model that returns only logits, given labels equal to its inputs: trainwise's own cross-entropy would
    teach each position to copy its input; the user is told once."""

    class LogitsOnly(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = tiny_gpt2(seed=0)

        def forward(self, input_ids, attention_mask=None):
            return self.lm(input_ids=input_ids, attention_mask=attention_mask).logits

    model = LogitsOnly()
    batch = _stack(token_batches(4))
    with pytest.warns(UserWarning, match="labels equal to the input tokens at the same positions"):
        tw.forward_micro_batch(model, batch, count="tokens")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tw.forward_micro_batch(model, batch, count="tokens")  # once per model
