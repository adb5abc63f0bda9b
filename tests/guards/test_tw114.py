"""TW114 at run time: submodules, parameters and trainable tensors a module holds without registering them (plain
lists, tuples, dicts, dataclass fields, plain attributes), found once when the guard starts and named by their
attribute path; the registered ways, deliberate aliases and the modules of real libraries stay silent."""

from __future__ import annotations

import dataclasses
import time
import warnings

import pytest
import torch
from torch import nn

import trainwise as tw
from trainwise.guards.tw114_unregistered_module import UnregisteredModule


class _Stem(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(4, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.stem(x)))


def _found(model: nn.Module, **options: object) -> list[tuple[str, str, int]]:
    with tw.guard(model, action="record", checks=["TW114"], **options) as guard:  # type: ignore[arg-type]
        pass
    return [(f.code, f.where, f.step) for f in guard.findings]


def _messages(model: nn.Module) -> list[str]:
    with tw.guard(model, action="record", checks=["TW114"]) as guard:
        pass
    return [str(f) for f in guard.findings]


class _Blocks(_Stem):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = [nn.Linear(8, 8) for _ in range(3)]  # the mistake: a plain list

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x)


def test_layers_in_a_plain_list_are_one_finding_naming_each_path_at_install() -> None:
    model = _Blocks()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(tw.guards.GuardWarning) as record, tw.guard(model, optimizer, checks=["TW114"]) as guard:
        assert [(f.code, f.where, f.step) for f in guard.findings] == [("TW114", "blocks", 0)]  # before any step
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(5, 4)).sum().backward()
            optimizer.step()
    assert len(guard.findings) == 1 and len([w for w in record if isinstance(w.message, tw.guards.GuardWarning)]) == 1
    text = str(guard.findings[0])
    assert "`model.blocks[0]`, `model.blocks[1]` and `model.blocks[2]` (Linear) are held in a plain list" in text
    assert "the optimizer never updates them" in text and "use an nn.ModuleList instead" in text
    assert "trainwise doctor --explain TW114" in text and "trainwise lab unregistered" in text


def test_a_dict_a_nested_container_and_a_submodule_are_named_by_their_paths() -> None:
    class Heads(_Stem):
        def __init__(self) -> None:
            super().__init__()
            self.heads = {"a": nn.Linear(8, 2), "b": nn.Linear(8, 3)}
            self.towers = {"x": [nn.Linear(8, 8), nn.Linear(8, 8)]}
            self.pair = (nn.ReLU(), nn.Linear(8, 8))  # the ReLU loses nothing; the Linear its weights

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = nn.ModuleList([Heads()])

    model = Outer()
    assert _found(model) == [("TW114", "encoder.0.heads", 0), ("TW114", "encoder.0.towers", 0),
                             ("TW114", "encoder.0.pair", 0)]
    heads, towers, pair = _messages(model)
    assert "`model.encoder[0].heads['a']` and `model.encoder[0].heads['b']` (Linear)" in heads
    assert "use an nn.ModuleDict instead" in heads
    assert "`model.encoder[0].towers['x'][0]` and `model.encoder[0].towers['x'][1]`" in towers
    assert "`model.encoder[0].pair[1]` (Linear) is held in a plain tuple" in pair


def test_a_tensor_requiring_grad_and_parameters_in_a_list() -> None:
    class Scaled(_Stem):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.ones(1, requires_grad=True)  # a plain attribute: nn.Module keeps it unregistered
            self.gains = [nn.Parameter(torch.ones(8)) for _ in range(2)]

    model = Scaled()
    assert _found(model) == [("TW114", "scale", 0), ("TW114", "gains", 0)]
    scale, gains = _messages(model)
    assert "`model.scale` (tensor with requires_grad=True) is held as a plain tensor attribute" in scale
    assert "`self.scale = nn.Parameter(...)`, or register_buffer('scale', ...)" in scale
    assert "(nn.Parameter) are held in a plain list" in gains and "nn.ParameterList" in gains


def test_a_module_set_past_setattr_and_a_dataclass_field() -> None:
    @dataclasses.dataclass
    class Parts:
        head: nn.Module
        name: str = "parts"

    class Hidden(_Stem):
        def __init__(self) -> None:
            super().__init__()
            object.__setattr__(self, "extra", nn.Linear(8, 8))
            self.parts = Parts(nn.Linear(8, 2))

    model = Hidden()
    assert _found(model) == [("TW114", "extra", 0), ("TW114", "parts", 0)]
    extra, parts = _messages(model)
    assert "`model.extra` (Linear) is held as a plain attribute" in extra and "`self.extra = ...`" in extra
    assert "`model.parts.head` (Linear) is held in a plain Parts" in parts


def test_a_dataclass_is_read_as_stored_and_one_that_cannot_be_read_is_skipped() -> None:
    """transformers' configs are dataclasses whose __getattribute__ may raise (a per-layer attribute read
    globally): fields are read from the instance's __dict__, and an attribute that cannot be walked is skipped."""

    @dataclasses.dataclass
    class Touchy:
        head: nn.Module

        def __getattribute__(self, name: str) -> object:
            if name == "head":
                raise RuntimeError("ambiguous")
            return object.__getattribute__(self, name)

    @dataclasses.dataclass(slots=True)
    class Slotted:  # no __dict__ to read
        head: nn.Module

    class Configured(_Stem):
        def __init__(self) -> None:
            super().__init__()
            self.touchy = Touchy(nn.Linear(8, 2))
            self.slotted = Slotted(nn.Linear(8, 2))

    assert _found(Configured()) == [("TW114", "touchy", 0)]


def test_dropout_in_a_list_is_found_for_eval_mode() -> None:
    class Drops(_Stem):
        def __init__(self) -> None:
            super().__init__()
            self.drops = [nn.Dropout(0.1), nn.Dropout(0.0)]  # only the first drops anything

    model = Drops()
    assert _found(model) == [("TW114", "drops", 0)]
    (text,) = _messages(model)
    assert "`model.drops[0]` (Dropout) is held" in text and "model.eval() does not reach it" in text


def test_action_raise_raises_when_the_guard_starts() -> None:
    with pytest.raises(tw.guards.GuardError) as error:
        tw.guard(_Blocks(), action="raise", checks=["TW114"])
    assert (error.value.code, error.value.where) == ("TW114", "blocks")


@pytest.mark.filterwarnings("ignore:`torch.nn.utils.weight_norm` is deprecated:FutureWarning")
def test_the_registered_ways_and_deliberate_aliases_are_silent() -> None:
    class Clean(_Stem):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(8, 8) for _ in range(2)])
            self.heads = nn.ModuleDict({"a": nn.Linear(8, 2)})
            self.gains = nn.ParameterList([nn.Parameter(torch.ones(8))])
            self.scales = nn.ParameterDict({"a": nn.Parameter(torch.ones(1))})
            self.register_buffer("mean", torch.zeros(8))
            self.sizes = [8, 16, 32]  # a list of non-modules
            self.names = {"a": "head", "b": None}
            self.table = [torch.arange(4)]  # tensors that do not require grad
            self.mask = torch.ones(8)  # a plain constant: common and mostly deliberate
            self.cached = torch.ones(2, requires_grad=True) * 2  # a non-leaf tensor: an output, not a parameter
            self.layers = list(self.blocks)  # an alias of registered modules
            self.params = [self.stem.weight]  # an alias of a registered parameter
            self.activations = [nn.ReLU(), nn.GELU()]  # no parameter, no dropout: nothing is lost
            teacher = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.1)).requires_grad_(False).eval()
            self.teacher = [teacher]  # a frozen module hidden on purpose (kept out of state_dict)
            object.__setattr__(self, "parent", self)  # a back-reference
            self.rnn = nn.LSTM(4, 8)  # keeps its parameters in a plain list too (_flat_weights)
            self.norm = nn.utils.parametrizations.weight_norm(nn.Linear(8, 8))
            self.old_norm = nn.utils.weight_norm(nn.Linear(8, 8))  # `weight` becomes a computed plain tensor
            self.attention = nn.MultiheadAttention(8, 2)
            self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16), num_layers=2,
                                                 enable_nested_tensor=False)

    assert _found(Clean()) == []


def test_nothing_runs_after_install() -> None:
    """One walk when the guard starts: the check has no per-step or per-check work."""
    from trainwise.guards.check import Check

    for event in ("before_forward", "after_forward", "before_step", "after_step", "on_check"):
        assert getattr(UnregisteredModule, event) is getattr(Check, event), event


def test_the_trainer_reports_it_at_the_start_of_fit(tmp_path) -> None:
    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tw.Trainer(epochs=1, batch_size=8, device="cpu", progress="off", plot=False, diagnose=False,
                   checkpoints=False, run_dir=str(tmp_path / "run")).fit(_Blocks, data)
    found = [r for r in tw.read_log(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "guard"]
    assert [(r["code"], r["where"], r["step"]) for r in found] == [("TW114", "blocks", 0)]


def _tiny_gpt2() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100))


def test_transformers_models_are_silent_and_walked_in_milliseconds() -> None:
    transformers = pytest.importorskip("transformers")
    gpt2 = _tiny_gpt2()
    started = time.perf_counter()
    assert _found(gpt2) == []
    seconds = time.perf_counter() - started
    assert seconds < 0.5, seconds  # a few milliseconds: once, when the guard starts
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=32))
    bert = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=100, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=32, num_labels=3))
    assert _found(llama) == [] and _found(bert) == []
    llama(torch.randint(0, 100, (2, 6)))  # after a forward (rotary caches, attention masks) too
    assert _found(llama) == []


def test_lightning_and_torchmetrics_modules_are_silent() -> None:
    lightning = pytest.importorskip("lightning")
    torchmetrics = pytest.importorskip("torchmetrics")

    class Classifier(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
            self.accuracy = torchmetrics.classification.MulticlassAccuracy(num_classes=3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

    model = Classifier()
    model.accuracy.update(torch.randn(4, 3), torch.randint(0, 3, (4,)))
    assert _found(model) == []
