"""``trainwise.integrations.transformers.TrainwiseGuard`` in a real Hugging Face ``Trainer`` on the CPU (tiny
models from configs, random weights, no download): a clean run reports and logs nothing; each mistake the guards
catch inside the Trainer is reported with its code and place, and its count joins the Trainer's logs, which
TensorBoard receives. The Trainer wraps the optimizer through Accelerate and calls ``model.train()`` on every
step, so a frozen BatchNorm there is TW108."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
from hf_models import tiny_bert_classifier, token_batches  # noqa: E402

from trainwise.guards import GuardWarning  # noqa: E402
from trainwise.integrations.transformers import TrainwiseGuard  # noqa: E402


class TinyConfig(transformers.PretrainedConfig):
    model_type = "trainwise-tiny-mlp"


class TinyMLP(transformers.PreTrainedModel):
    """A PreTrainedModel of two linear layers; ``mistake`` injects one error."""

    config_class = TinyConfig

    def __init__(self, config: TinyConfig, mistake: str | None = None) -> None:
        super().__init__(config)
        self.body, self.head = nn.Linear(4, 8), nn.Linear(8, 3)
        self.mistake = mistake
        if mistake == "unregistered_adapter":
            self.adapters = [nn.Linear(8, 8)]  # a plain list: not in parameters(), never trained nor saved
        self.post_init()
        self.start = [p.detach().clone() for p in self.parameters()]

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        hidden = torch.relu(self.body(x))
        if self.mistake == "unregistered_adapter":
            hidden = hidden + self.adapters[0](hidden)
        logits = self.head(hidden)
        loss = nn.functional.cross_entropy(logits, labels)
        if self.mistake == "sqrt_of_zero":  # an L2-SP pull to the start, through sqrt: its gradient at 0 is NaN
            loss = loss + 0.01 * sum(((p - p0) ** 2).sum() for p, p0 in zip(self.parameters(), self.start)).sqrt()
        return {"loss": loss, "logits": logits}


def _table(n: int = 32) -> datasets.Dataset:
    g = torch.Generator().manual_seed(0)
    return datasets.Dataset.from_dict({"x": torch.randn(n, 4, generator=g).tolist(),
                                       "labels": [i % 3 for i in range(n)]}).with_format("torch")


def _token_samples(n: int = 16):
    samples = token_batches(n, ragged=False)
    for i, sample in enumerate(samples):
        sample["labels"] = torch.tensor(i % 3)
    return samples


def _tiny_resnet(*, frozen_stem: bool):
    torch.manual_seed(0)
    config = transformers.ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                       num_labels=3, layer_type="basic")
    model = transformers.ResNetForImageClassification(config)
    if frozen_stem:
        model.resnet.embedder.requires_grad_(False)  # the stem frozen; the Trainer's model.train() each step
    return model


def _images(n: int = 16):
    g = torch.Generator().manual_seed(0)
    return [{"pixel_values": torch.randn(3, 16, 16, generator=g), "labels": torch.tensor(i % 3)} for i in range(n)]


class EvaluatesInTrainMode(transformers.TrainerCallback):
    """TW103: an evaluation under no_grad after each step, the model left in train mode."""

    def on_step_end(self, args, state, control, model=None, **kwargs):
        with torch.no_grad():
            model(**torch.utils.data.default_collate(_token_samples(2)))


class EvaluatesWithGrad(transformers.TrainerCallback):
    """TW104: an evaluation in eval mode without no_grad; ``keep_last`` keeps the last one's output alive."""

    def __init__(self, keep_last: bool = False) -> None:
        self.keep_last, self.kept = keep_last, None

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.keep_last and state.global_step < state.max_steps:
            return
        model.eval()
        self.kept = model(**torch.utils.data.default_collate(_token_samples(2)))
        model.train()


class KeepsLosses(transformers.Trainer):
    """TW102: a ``compute_loss`` override that keeps every loss, graph and all."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kept: list[torch.Tensor] = []

    def compute_loss(self, model, inputs, *args, **kwargs):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        self.kept.append(loss)
        return loss


def _train(tmp_path, model, data, *, eval_data=None, callbacks=(), trainer_class=None, report_to=(), **options):
    guard = TrainwiseGuard(action="record")
    args = transformers.TrainingArguments(**{
        "output_dir": str(tmp_path / "out"), "max_steps": 4, "per_device_train_batch_size": 4,
        "save_strategy": "no", "logging_steps": 2, "report_to": list(report_to), "use_cpu": True,
        "disable_tqdm": True, "dataloader_num_workers": 0, **options})
    trainer = (trainer_class or transformers.Trainer)(model=model, args=args, train_dataset=data,
                                                       eval_dataset=eval_data, callbacks=[*callbacks, guard])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    return guard, trainer


def _logged(trainer, name: str) -> list[tuple[int, float]]:
    return [(entry["step"], entry[name]) for entry in trainer.state.log_history if name in entry]


def test_a_clean_run_with_evaluation_and_accumulation_reports_and_logs_nothing(tmp_path):
    guard, trainer = _train(tmp_path, tiny_bert_classifier(dropout=0.1), _token_samples(),
                            eval_data=_token_samples(8), gradient_accumulation_steps=2, eval_strategy="steps",
                            eval_steps=2, per_device_eval_batch_size=4)
    assert guard.findings == []
    assert guard.guard.step == 4  # optimizer steps, through Accelerate's AcceleratedOptimizer
    assert type(guard.guard.optimizer).__module__.startswith("torch.optim")
    assert not [key for entry in trainer.state.log_history for key in entry if key.startswith("trainwise/")]


def test_a_frozen_batchnorm_the_trainer_puts_in_train_mode_is_reported_and_reaches_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    guard, trainer = _train(tmp_path, _tiny_resnet(frozen_stem=True), _images(), report_to=["tensorboard"])
    assert [(f.code, f.where) for f in guard.findings] == [("TW108", "resnet.embedder.embedder.normalization")]
    assert _logged(trainer, "trainwise/TW108")[:2] == [(2, 1.0), (4, 1.0)]  # with the loss, at each log
    events = EventAccumulator(str(next((tmp_path / "out" / "runs").iterdir()))).Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/trainwise/TW108")][:2] == [(2, 1.0), (4, 1.0)]
    guard, trainer = _train(tmp_path, _tiny_resnet(frozen_stem=False), _images())
    assert guard.findings == []


@pytest.mark.parametrize(("mistake", "code", "where"), [
    ("unregistered_adapter", "TW114", "adapters"),
    ("sqrt_of_zero", "TW113", "body.weight"),
])
def test_a_mistake_inside_a_pretrained_model_is_reported_and_logged(tmp_path, mistake, code, where):
    guard, trainer = _train(tmp_path, TinyMLP(TinyConfig(), mistake=mistake), _table())
    assert [(f.code, f.where) for f in guard.findings] == [(code, where)]
    assert _logged(trainer, f"trainwise/{code}")[0] == (2, 1.0)
    guard, trainer = _train(tmp_path, TinyMLP(TinyConfig()), _table())
    assert guard.findings == []


@pytest.mark.slow
@pytest.mark.parametrize(("mistake", "code"), [
    ("kept_loss", "TW102"), ("eval_in_train_mode", "TW103"), ("eval_with_grad", "TW104")])
def test_a_mistake_in_the_training_code_around_the_model_is_reported(tmp_path, mistake, code):
    callbacks = {"eval_in_train_mode": [EvaluatesInTrainMode()], "eval_with_grad": [EvaluatesWithGrad()]}
    guard, trainer = _train(tmp_path, tiny_bert_classifier(dropout=0.1), _token_samples(),
                            callbacks=callbacks.get(mistake, ()),
                            trainer_class=KeepsLosses if mistake == "kept_loss" else None)
    assert [f.code for f in guard.findings] == [code]
    assert _logged(trainer, f"trainwise/{code}")[-1] == (4, 1.0)


def test_a_finding_of_the_last_checks_is_logged_once_more_and_warned(tmp_path):
    """An evaluation with grad at the last step, its output kept: only the checks at the end of training find
    it, after the Trainer's last log; it is logged the way the Trainer logs, and warned."""
    keeps = EvaluatesWithGrad(keep_last=True)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=2, logging_steps=1,
                                          per_device_train_batch_size=4, save_strategy="no", report_to=[],
                                          use_cpu=True, disable_tqdm=True)
    printed = []

    class Prints(transformers.TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            printed.append(dict(logs))

    trainer = transformers.Trainer(model=tiny_bert_classifier(), args=args, train_dataset=_token_samples(8),
                                   callbacks=[keeps, Prints(), TrainwiseGuard()])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    assert [str(w.message)[:15] for w in caught if issubclass(w.category, GuardWarning)] == ["TW104 at step 2"]
    assert trainer.state.log_history[-1] == {"trainwise/TW104": 1.0, "step": 2}
    assert printed[-1] == {"trainwise/TW104": 1.0}  # the other callbacks' on_log saw it
    assert isinstance(trainer.callback_handler.callbacks[0], TrainwiseGuard)  # moved first
