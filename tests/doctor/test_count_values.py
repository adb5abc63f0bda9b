"""What a count counts, compared with what the total it divides summed (issue 45, TW101): a count of a loader's
batches off by one (``len(loader) + 1``, a counter started at 1, the ``enumerate`` index read after the loop)
or the count of another loader's loop gives neither the per-batch nor the per-sample mean. Each form has its
fixture and near-misses that stay silent (a mean of per-batch means over the exact batch count is right)."""

from __future__ import annotations

from trainwise.doctor.engine import Config, check_sources


def _codes(sources: dict[str, str], code: str = "TW101") -> list[tuple[str, int]]:
    found = check_sources(sources, config=Config(select=(code,)))
    return sorted((path, f.line) for path, findings in found.items() for f in findings if f.code == code)


_TRAINER = """
import torch

class SegTrainer:
    def __init__(self, model, criterion, val_loader):
        self.model = model
        self.criterion = criterion
        self.val_loader = val_loader

    @torch.no_grad()
    def validate(self):
        self.model.eval()
        dice_loss = 0.0
        for images, masks in self.val_loader:
            dice_loss += self.criterion(self.model(images), masks).item()
        return dice_loss / (len(self.val_loader) + 1)
"""


def test_a_total_over_a_loader_divided_by_its_batch_count_plus_one_in_a_class_of_another_file():
    run = """
from torch.utils.data import DataLoader
from engine.trainer import SegTrainer

def main(model, criterion, dataset):
    trainer = SegTrainer(model, criterion, DataLoader(dataset, batch_size=8))
    print(trainer.validate())
"""
    assert _codes({"engine/trainer.py": _TRAINER, "run.py": run}) == [("engine/trainer.py", 16)]


def test_a_batch_counter_started_at_one_or_the_enumerate_index_after_the_loop_is_off_by_one():
    counter = """
import torch

def evaluate(model, criterion, test_loader):
    seen_batches = 1
    total = 0.0
    with torch.no_grad():
        for x, y in test_loader:
            total += criterion(model(x), y).item()
            seen_batches += 1
    return total / seen_batches
"""
    index = """
def train_epoch(model, opt, criterion, train_loader):
    running = 0.0
    for step, (x, y) in enumerate(train_loader):
        opt.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        opt.step()
        running += loss.item()
    return running / step
"""
    assert _codes({"evaluate.py": counter, "train.py": index}) == [("evaluate.py", 11), ("train.py", 10)]


def test_a_validation_total_divided_by_the_training_loop_s_batch_counter():
    script = """
def fit(model, opt, criterion, train_loader, val_loader):
    train_loss, val_loss, n_train, n_val = 0.0, 0.0, 0, 0
    for x, y in train_loader:
        opt.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        opt.step()
        train_loss += loss.item()
        n_train += 1
    for x, y in val_loader:
        val_loss += criterion(model(x), y).item()
        n_val += 1
    print(train_loss / n_train, val_loss / n_train)
"""
    assert _codes({"fit.py": script}) == [("fit.py", 14)]


def test_exact_batch_counts_sample_counts_epsilons_and_progress_fractions_stay_silent():
    exact = """
def evaluate(model, criterion, val_loader):
    total, steps, per_sample, seen = 0.0, 0, 0.0, 0
    for i, (x, y) in enumerate(val_loader):
        loss = criterion(model(x), y)
        total += loss.item()
        per_sample += loss.item() * x.size(0)
        seen += x.size(0)
        steps += 1
        print(i / (len(val_loader) + 1), total / (i + 1))
    return (total / len(val_loader), total / steps, per_sample / seen, total / (len(val_loader) + 1e-8),
            total / max(len(val_loader), 1), per_sample / len(val_loader.dataset))
"""
    no_own_counter = """
def fit(model, criterion, train_loader, val_loader):
    n_train, val_loss = 0, 0.0
    for x, y in train_loader:
        n_train += 1
    for x, y in val_loader:
        val_loss += criterion(model(x), y).item()
    return val_loss / n_train
"""
    twice = """
def two_passes(model, criterion, loader):
    n, total = 0, 0.0
    for x, y in loader:
        n += 1
    for x, y in loader:
        total += criterion(model(x), y).item()
    return total / n
"""
    sometimes = """
def evaluate(model, criterion, val_loader):
    total = 0.0
    count = 1
    for x, y in val_loader:
        if x.numel():
            total += criterion(model(x), y).item()
        count += 1
    for j, (x, y) in enumerate(val_loader):
        pass
    return total / count, total / j
"""
    assert _codes({"exact.py": exact, "twice.py": twice, "sometimes.py": sometimes,
                   "no_own_counter.py": no_own_counter}) == []
