"""``trainwise.integrations.accelerate.guard`` in a real Accelerate loop on the CPU, the line after ``prepare``:
a clean loop reports and logs nothing; each mistake the guards catch in such a loop is reported with its code
and place, and its count reaches the accelerator's trackers (TensorBoard here, read back)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import trainwise as tw

accelerate = pytest.importorskip("accelerate")
from accelerate.state import AcceleratorState, GradientState  # noqa: E402

from trainwise.integrations.accelerate import guard  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """Accelerate keeps its state in process-wide singletons: each test builds its own Accelerator."""
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


class Recorder(accelerate.tracking.GeneralTracker):
    """A tracker as Accelerate's API defines one (``log_with=[Recorder()]``), keeping what it is sent."""

    name = "recorder"
    requires_logging_directory = False

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[tuple[dict, int | None]] = []

    @property
    def tracker(self):
        return self.logged

    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        if "held_out" not in values:  # the loop's own
            self.logged.append((values, step))


class Net(nn.Module):
    """A small MLP with BatchNorm and dropout; ``mistake`` injects what is wrong inside the model."""

    def __init__(self, mistake: str | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2))
        self.head = nn.Linear(16, 3)
        self.mistake = mistake
        if mistake == "unregistered_head":
            self.extra = [nn.Linear(3, 3)]  # a plain list: not in parameters(), never trained
        if mistake == "frozen_norm_in_train_mode":
            self.body[:2].requires_grad_(False)  # frozen, but the loop's model.train() puts the BatchNorm back

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.head(self.body(x))
        return self.extra[0](out) if self.mistake == "unregistered_head" else out


def _loop(*, mistake: str | None = None, accumulation: int = 1, precision: str = "no", tracker="recorder",
          tmp_path=None, action: str = "record"):
    """Accelerate's documented loop over 16 micro-batches, an evaluation after each optimizer step; guarded by the
    helper after ``prepare``, closed at the end. Its tracker: a ``Recorder``, or ``"tensorboard"`` in ``tmp_path``.
    """
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=accumulation,
                                         mixed_precision=precision, project_dir=tmp_path,
                                         log_with=[Recorder()] if tracker == "recorder" else tracker)
    accelerator.init_trackers("run")
    module = Net(mistake)
    optimizer = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=0.05)
    start = [p.detach().clone() for p in module.parameters()]
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4, generator=g), torch.randint(0, 3, (64,), generator=g))
    model, optimizer, loader = accelerator.prepare(module, optimizer, torch.utils.data.DataLoader(data, batch_size=4))
    watched = guard(accelerator, model, optimizer, action=action)  # the line under test: after prepare
    kept = []
    for x, y in loader:
        model.train()
        with accelerator.accumulate(model):
            loss = nn.functional.cross_entropy(model(x), y)
            if mistake == "sqrt_of_zero":  # an L2-SP pull to the start, through sqrt: its gradient at 0 is NaN
                loss = loss + 0.01 * sum(((p - p0) ** 2).sum() for p, p0 in zip(module.parameters(), start)).sqrt()
            accelerator.backward(loss)
            optimizer.step()
            if mistake != "no_zero_grad":
                optimizer.zero_grad()
        if mistake == "kept_loss":
            kept.append(loss)  # the graph of every micro-batch stays alive
        if accelerator.sync_gradients:
            if mistake != "eval_in_train_mode":
                model.eval()
            if mistake == "eval_with_grad":
                accelerator.log({"held_out": nn.functional.cross_entropy(model(x), y).item()})
            else:
                with torch.no_grad():
                    model(x)
    watched.close()
    accelerator.end_training()
    return watched, accelerator.trackers[0].tracker if tracker == "recorder" else None


@pytest.mark.parametrize(("accumulation", "precision"), [(1, "no"), (4, "bf16")])
def test_a_clean_loop_reports_and_logs_nothing(accumulation, precision):
    watched, logged = _loop(accumulation=accumulation, precision=precision)
    assert watched.findings == [] and watched.step == 16 // accumulation
    assert type(watched.optimizer).__module__.startswith("torch.optim")  # inside the AcceleratedOptimizer
    assert logged == []


MISTAKES = [
    ("kept_loss", "TW102", "(the model)"),
    ("eval_in_train_mode", "TW103", "body.1"),
    ("eval_with_grad", "TW104", "(the model)"),
    ("no_zero_grad", "TW105", "SGD"),
    ("frozen_norm_in_train_mode", "TW108", "body.1"),
    ("sqrt_of_zero", "TW113", "body.0.weight"),
    ("unregistered_head", "TW114", "extra"),
]


@pytest.mark.parametrize(("mistake", "code", "where"), MISTAKES)
def test_each_mistake_in_an_accelerate_loop_is_reported_and_logged(mistake, code, where):
    watched, logged = _loop(mistake=mistake)
    assert [(f.code, f.where) for f in watched.findings] == [(code, where)]
    assert logged == [({f"trainwise/{code}": 1.0}, watched.findings[0].step)]


@pytest.mark.parametrize(("mistake", "code"), [("kept_loss", "TW102"), ("frozen_norm_in_train_mode", "TW108")])
def test_a_mistake_under_accumulation_and_bf16_is_reported(mistake, code):
    watched, _ = _loop(mistake=mistake, accumulation=4, precision="bf16")
    assert [f.code for f in watched.findings] == [code]


def test_the_count_reaches_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    watched, _ = _loop(mistake="kept_loss", tracker="tensorboard", tmp_path=tmp_path)
    assert _scalars(tmp_path) == {"trainwise/TW102": [(watched.findings[0].step, 1.0)]} and watched.step == 16


def test_a_finding_is_warned_and_the_helper_wants_the_accelerator_first():
    with pytest.warns(tw.guards.GuardWarning, match="TW108 at step 0"):
        _loop(mistake="frozen_norm_in_train_mode", action="warn")
    with pytest.raises(tw.TrainwiseError, match="takes the Accelerator first, got Sequential"):
        guard(nn.Sequential(), nn.Linear(2, 2))


def _scalars(folder) -> dict[str, list[tuple[int, float]]]:
    """Every scalar the TensorBoard tracker wrote under ``folder``, by tag (but the loop's own held_out)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found = {}
    for run in (folder / "run").iterdir():
        events = EventAccumulator(str(run)).Reload()
        for tag in events.Tags()["scalars"]:
            if tag != "held_out":
                found[tag] = [(e.step, round(e.value, 6)) for e in events.Scalars(tag)]
    return found
