"""A resume continues the run that wrote the checkpoint, or says in one sentence what changed.

Before: a resume with another batch_size silently skipped part of an epoch, a changed lr was silently
ignored, switching to SGD ended in KeyError: 'momentum', and an added scheduler got advice (strict=False) a
fit user could not act on.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainwise import Trainer, TrainwiseError, read_log


def _data(n=48):
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g))


def _model(width=8):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, 3))


def _fit(run_dir, model=None, data=None, **options):
    settings = dict(epochs=2, batch_size=8, lr=1e-2, device="cpu", progress="off", plot=False, diagnose=False,
                    run_dir=str(run_dir))
    settings.update(options)
    model = model if model is not None else _model()
    return model, Trainer(**settings).fit(model, data if data is not None else _data())


@pytest.fixture
def run(tmp_path):
    _fit(tmp_path / "run")  # two epochs, a checkpoint at each end
    return tmp_path / "run"


@pytest.mark.parametrize(("change", "named"), [
    ({"batch_size": 16}, "batch_size 8 -> 16"),
    ({"accumulation_steps": 2}, "accumulation_steps None -> 2"),
    ({"seed": 1}, "seed 0 -> 1"),
    ({"lr": 1e-3}, "lr 0.01 -> 0.001"),
    ({"optimizer": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)}, "optimizer 'AdamW' -> 'SGD'"),
    ({"scheduler": lambda o: torch.optim.lr_scheduler.StepLR(o, 1)}, "scheduler None -> 'StepLR'"),
])
def test_a_change_that_breaks_exact_continuation_is_refused_naming_it(run, change, named):
    with pytest.raises(TrainwiseError) as caught:
        _fit(run, epochs=3, resume="auto", **change)
    message = str(caught.value)
    assert named in message and "resume_mismatch='allow'" in message and message.count("\n") == 0


def test_another_data_set_size_is_refused(run):
    with pytest.raises(TrainwiseError, match="train_samples 48 -> 40"):
        _fit(run, epochs=3, resume="auto", data=_data(40))


def test_another_model_is_refused_with_the_shapes(run):
    with pytest.raises(TrainwiseError, match=r"changed shape \(0.weight \(8, 4\) -> \(6, 4\)\)"):
        _fit(run, model=_model(6), epochs=3, resume="auto", resume_mismatch="allow")


@pytest.mark.parametrize("change", [
    {"optimizer": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)},
    {"scheduler": lambda o: torch.optim.lr_scheduler.StepLR(o, 1)},
    {"lr": 1e-3},
    {"batch_size": 16},
])
def test_allow_continues_and_logs_what_changed(run, change):
    _, result = _fit(run, epochs=3, resume="auto", resume_mismatch="allow", **change)
    assert [r["epoch"] for r in result.history] == [1, 2, 3]
    records = read_log(run / "metrics.jsonl", raw=True)
    mismatch = [r for r in records if r["kind"] == "resume_mismatch"]
    assert len(mismatch) == 1 and next(iter(change)) in mismatch[0]["changes"]


def test_harmless_changes_continue_exactly(tmp_path):
    straight, _ = _fit(tmp_path / "straight", epochs=3)
    _fit(tmp_path / "resumed", epochs=2)
    resumed, result = _fit(tmp_path / "resumed", epochs=3, resume="auto", log_every=1, progress="lines",
                           keep_last=1, diagnose=True)
    assert [r["epoch"] for r in result.history] == [1, 2, 3]
    for key, value in straight.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key


def test_other_data_of_the_same_size_is_refused_and_allow_continues(run):
    other = TensorDataset(torch.randn(48, 4, generator=torch.Generator().manual_seed(7)), torch.zeros(48).long())
    with pytest.raises(TrainwiseError, match=r"\(train_data '[0-9a-f]{16}' -> '[0-9a-f]{16}'\)"):
        _fit(run, epochs=3, resume="auto", data=other)
    _, result = _fit(run, epochs=3, resume="auto", resume_mismatch="allow", data=other)
    assert [r["epoch"] for r in result.history] == [1, 2, 3]


def test_another_loss_fn_is_refused(tmp_path):
    _fit(tmp_path / "run", loss_fn=nn.CrossEntropyLoss())
    with pytest.raises(TrainwiseError, match=r"loss_fn 'torch.nn.modules.loss.CrossEntropyLoss' -> "
                                             r"'torch.nn.modules.loss.NLLLoss'"):
        _fit(tmp_path / "run", epochs=3, resume="auto", loss_fn=nn.NLLLoss())
    _, result = _fit(tmp_path / "run", epochs=3, resume="auto", loss_fn=nn.CrossEntropyLoss())  # the same: fine
    assert [r["epoch"] for r in result.history] == [1, 2, 3]


def test_a_loss_fn_description_names_functions_classes_and_lambdas_by_their_code():
    import functools

    from trainwise.checkpoint.compat import describe_callable

    assert describe_callable(None) is None
    assert describe_callable(torch.nn.functional.cross_entropy) == "torch.nn.functional.cross_entropy"
    assert describe_callable(nn.MSELoss()) == "torch.nn.modules.loss.MSELoss"
    assert describe_callable(functools.partial(torch.nn.functional.cross_entropy, label_smoothing=0.1)) == (
        "functools.partial(torch.nn.functional.cross_entropy)")
    first, same, other = (lambda o, t: (o - t).abs().mean()), (lambda o, t: (o - t).abs().mean()), (
        lambda o, t: ((o - t) ** 2).mean())
    assert describe_callable(first) == describe_callable(same) != describe_callable(other)
    assert "<lambda> #" in describe_callable(first)


class Augmented(torch.utils.data.Dataset):
    """A data set with a random transform, of any sample structure, counting its reads."""

    def __init__(self, n=48):
        self.n, self.reads = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        import numpy as np

        self.reads += 1
        noise = torch.randn(4)  # a random augmentation: the global RNG
        return {"x": torch.full((4,), float(index)) + noise, "mask": np.ones(2), "id": f"s{index}",
                "meta": [index, 0.5, None, b"raw"]}


def test_the_data_fingerprint_reads_two_samples_repeats_under_random_transforms_and_moves_no_rng():
    import random

    import numpy as np

    from trainwise.checkpoint.compat import data_fingerprint

    data = Augmented()
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    before = (torch.random.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    first = data_fingerprint(data)
    assert data.reads == 2 and first is not None and first == data_fingerprint(Augmented())
    assert torch.equal(torch.random.get_rng_state(), before[0]) and random.getstate() == before[1]
    assert (np.random.get_state()[1] == before[2]).all()
    assert data_fingerprint(Augmented(47)) != first  # another last sample
    assert data_fingerprint(torch.utils.data.TensorDataset(torch.zeros(0, 3))) is None  # empty

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield torch.zeros(3)

    assert data_fingerprint(Stream()) is None


class Noisy(torch.utils.data.Dataset):
    """_data() with a random augmentation of every sample."""

    def __init__(self):
        self.base = _data()

    def __len__(self):
        return len(self.base)

    def __getitem__(self, index):
        x, y = self.base[index]
        return x + 0.1 * torch.randn(4), y


def test_random_transforms_do_not_refuse_a_resume(tmp_path):
    _fit(tmp_path / "run", data=Noisy())
    _, result = _fit(tmp_path / "run", epochs=3, resume="auto", data=Noisy())
    assert [r["epoch"] for r in result.history] == [1, 2, 3]
