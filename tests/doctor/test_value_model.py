"""What the doctor knows a value to be, asked directly: a forward run through a member of a module
(``model.forward(x)``, ``agent.act(obs)``), a module of unknown class known by what is done to it, and
numbers that carry no graph into a loss."""

from __future__ import annotations

import ast

from trainwise.doctor.context import Context
from trainwise.doctor.engine import check_source

_NET = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 2)
        self.scale = 2.0

    def forward(self, x):
        return self.body(x) * self.scale

    @torch.no_grad()
    def predict(self, x):
        return self.body(x).argmax(-1)

    def value(self, x):
        return self.body(x).sum(-1)

    def size(self, x):
        return x.shape[0]
"""


def _calls(source: str) -> tuple[Context, dict[str, ast.Call]]:
    ctx = Context(ast.parse(source), source, "net.py")
    return ctx, {ctx.segment(n.func): n for n in ctx.nodes(ast.Call)}  # type: ignore[misc]


def test_members_of_a_module_are_forwards_only_when_they_run_one():
    ctx, calls = _calls(_NET + """
net = Net()
a = net.forward(x)
b = net.value(x)
c = net.body(x)
d = net.predict(x)
e = net.size(x)
f = net.state_dict()
""")
    assert ctx.member_kinds_here("value") == {"forward"}
    assert ctx.member_kinds_here("predict") == {"no_grad"}
    assert ctx.member_kinds_here("scale") == {"other"}
    forwards = {name for name, call in calls.items() if ctx.is_model_call(call) and name.startswith("net.")}
    assert forwards == {"net.forward", "net.value", "net.body"}


def test_a_module_of_unknown_class_is_known_by_its_mode_and_state_dict():
    source = """
def play(policy_class, path):
    agent = policy_class()
    agent.load_state_dict(path)
    agent.eval()
    opt = make_optimizer()
    opt.load_state_dict(path)
    return agent, opt
"""
    ctx = Context(ast.parse(source), source, "play.py")
    names = {n.id: n for n in ctx.nodes(ast.Name) if isinstance(n.ctx, ast.Load)}  # type: ignore[attr-defined]
    assert ctx.is_module(names["agent"])
    assert not ctx.is_module(names["opt"])  # a state dict alone is an optimizer's too


def test_the_mode_free_message_names_the_module_behind_forward():
    source = _NET.replace("self.scale = 2.0", "").replace(" * self.scale", "") + """
net = Net()
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for x, y in train_loader:
    opt.zero_grad()
    net(x).sum().backward()
    opt.step()
for x, y in val_loader:
    print(net.forward(x).argmax(-1))
"""
    found = [f for f in check_source(source, "net.py") if f.code == "TW103"]
    assert len(found) == 1 and "no layer of it depends on the mode" in found[0].message, found


def test_numbers_from_numpy_carry_no_graph_into_a_loss():
    ctx, _ = _calls("""
import numpy as np
def step(model, x, returns, baseline):
    ratio = np.mean(returns) / np.mean(baseline)
    count = len(returns)
    logits = model(x)
    loss = ratio * count * logits.mean()
    loss.backward()
""")
    step = next(n for n in ctx.nodes(ast.FunctionDef))
    wanted = ctx.differentiated(step)
    assert {"logits", "ratio", "count"} <= wanted
    assert not {"returns", "baseline"} & wanted
