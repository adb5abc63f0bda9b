"""The runtime guard in a real Hugging Face ``transformers.Trainer``, installed the documented way: a
``TrainerCallback`` that starts it in ``on_train_begin`` (which gets the model and Accelerate's prepared
optimizer) and closes it in ``on_train_end``. A clean run with evaluation and gradient accumulation gets no
finding; a loss kept across steps and an evaluation in train mode get their codes. A few seconds each: slow."""

from __future__ import annotations

import warnings

import pytest
import torch

import trainwise as tw

transformers = pytest.importorskip("transformers")
from hf_models import tiny_bert_classifier, token_batches  # noqa: E402

pytestmark = pytest.mark.slow


class GuardCallback(transformers.TrainerCallback):
    """The documented way to guard a Hugging Face Trainer run."""

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.guard = tw.guard(model, optimizer, action="record")

    def on_train_end(self, args, state, control, **kwargs):
        self.guard.close()


class EvaluatesInTrainMode(transformers.TrainerCallback):
    """The mistake TW103 reports: an evaluation (no_grad) after a step, the model still in train mode."""

    def on_step_end(self, args, state, control, model=None, **kwargs):
        with torch.no_grad():
            model(**{k: v[:2] for k, v in _batch().items()})


class KeepsLosses(transformers.Trainer):
    """The mistake TW102 reports: a ``compute_loss`` override that keeps every loss, graph and all."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kept: list[torch.Tensor] = []

    def compute_loss(self, model, inputs, *args, **kwargs):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        self.kept.append(loss)
        return loss


def _samples(n: int = 16):
    samples = token_batches(n, ragged=False)
    for i, sample in enumerate(samples):
        sample["labels"] = torch.tensor(i % 3)  # a class per sequence
    return samples


def _batch():
    return torch.utils.data.default_collate(_samples(2))


def _train(tmp_path, *, mistake: str | None = None) -> tw.Guard:
    model = tiny_bert_classifier(dropout=0.1)
    guard_callback = GuardCallback()
    callbacks = [guard_callback] + ([EvaluatesInTrainMode()] if mistake == "eval_in_train_mode" else [])
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=6, per_device_train_batch_size=4, per_device_eval_batch_size=4,
        gradient_accumulation_steps=2, eval_strategy="steps", eval_steps=3, save_strategy="no",
        logging_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, dataloader_num_workers=0,
    )
    trainer_class = KeepsLosses if mistake == "kept_loss" else transformers.Trainer
    trainer = trainer_class(model=model, args=args, train_dataset=_samples(), eval_dataset=_samples(8),
                                   callbacks=callbacks)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    return guard_callback.guard


def test_a_clean_hf_trainer_run_gets_no_finding(tmp_path):
    guard = _train(tmp_path)
    assert guard.findings == []
    assert guard.step == 6  # optimizer steps (12 micro-batches, accumulation 2)
    assert type(guard.optimizer).__module__.startswith("torch.optim")  # inside Accelerate's wrapper


@pytest.mark.parametrize(("mistake", "code"), [("kept_loss", "TW102"), ("eval_in_train_mode", "TW103")])
def test_each_mistake_in_an_hf_trainer_run_gets_its_code(tmp_path, mistake, code):
    guard = _train(tmp_path, mistake=mistake)
    assert [f.code for f in guard.findings] == [code]
