"""The doctor's value model across the files of a project: what an attribute of a model is, learnt from the
classes that define it, whatever its name (issue 45). Each capability has its fixtures in several forms and a
near-miss that stays silent."""

from __future__ import annotations

from trainwise.doctor.engine import Config, check_sources


def _codes(sources: dict[str, str], code: str) -> list[tuple[str, int]]:
    found = check_sources(sources, config=Config(select=(code,)))
    return sorted((path, f.line) for path, findings in found.items() for f in findings if f.code == code)


_HEADS = """
import torch
from torch import nn

class OutputConv(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 1)

    def forward(self, x):
        return self.conv(x)

class Segmenter(nn.Module):
    def __init__(self):
        super().__init__()
        self.entry = nn.Conv2d(3, 8, 3)
        self.tail = OutputConv(8, 2)
        self.prototypes = nn.Parameter(torch.zeros(2, 8))
        self.temperature = 0.1

    def forward(self, x):
        return self.tail(self.entry(x)) / self.temperature
"""


def test_a_submodule_named_like_nothing_is_known_from_its_class_in_another_file():
    train = """
import torch
from nets.seg import Segmenter

def build():
    return Segmenter()

class Adapter:
    def __init__(self):
        self.model = build()
        self.model.tail.requires_grad = False
        self.optimizer = torch.optim.Adam(self.model.parameters(), weight_decay=5e-4)
"""
    assert _codes({"nets/seg.py": _HEADS, "train.py": train}, "TW110") == [("train.py", 11)]


def test_a_torch_layer_attribute_is_a_module_in_a_script_too():
    script = _HEADS + """
net = Segmenter()
net.entry.requires_grad = False
opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
"""
    assert _codes({"train.py": script}, "TW110") == [("train.py", 25)]


def test_a_parameter_or_a_member_that_is_a_module_in_one_class_only_stays_silent():
    other = """
import torch
from torch import nn

class Scaler(nn.Module):
    def __init__(self):
        super().__init__()
        self.tail = nn.Parameter(torch.ones(1))
"""
    train = """
import torch
from nets.seg import Segmenter

model = Segmenter()
model.prototypes.requires_grad = False
model.tail.requires_grad = False
opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad])
"""
    assert _codes({"nets/seg.py": _HEADS, "nets/scale.py": other, "train.py": train}, "TW110") == []


_RANKER = """
import numpy as np
import torch

def rank_users(net, users, k=10):
    hits = 0
    for u in users:
        scores = net.score(np.array([u]))
        hits += int(scores.argsort()[0] < k)
    return hits / len(users)
"""

_SCORER_MODEL = """
import torch
from torch import nn

class Recommender(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.item_table = nn.Embedding(n, 8)

    def forward(self, u):
        return self.item_table(u).sum(-1)

    def score(self, u):
        return self.item_table(torch.as_tensor(u)).sum(-1)
"""


def _trainer(evaluation: str) -> str:
    return f"""
import torch
from model import Recommender
from metrics import *

model = Recommender(100)
opt = torch.optim.Adam(model.parameters())
for epoch in range(10):
    model.train()
    for u in range(100):
        opt.zero_grad()
        model(torch.tensor([u])).sum().backward()
        opt.step()
    if epoch % 5 == 0:
{evaluation}
"""


def test_a_function_called_after_eval_is_an_evaluation_whatever_its_name_through_a_star_import():
    sources = {"model.py": _SCORER_MODEL, "metrics.py": _RANKER,
               "train.py": _trainer("        model.eval()\n        print(rank_users(model, range(100)))")}
    assert _codes(sources, "TW104") == [("metrics.py", 8)]


def test_a_same_file_helper_entered_in_eval_mode_from_an_outer_block():
    script = _SCORER_MODEL + _RANKER.replace("import numpy as np\nimport torch\n", "import numpy as np\n") + """
model = Recommender(100)
opt = torch.optim.Adam(model.parameters())
for epoch in range(10):
    model.eval()
    if epoch % 5 == 0:
        print(rank_users(model, range(100)))
    model.train()
    for u in range(100):
        opt.zero_grad()
        model(torch.tensor([u])).sum().backward()
        opt.step()
"""
    found = _codes({"train.py": script}, "TW104")
    assert found == [("train.py", 21)], found


def test_helpers_entered_in_train_mode_or_under_no_grad_stay_silent():
    back_to_train = _trainer("        model.eval()\n        model.train()\n        print(rank_users(model, range(9)))")
    no_grad = _trainer("        model.eval()\n        with torch.no_grad():\n"
                       "            print(rank_users(model, range(9)))")
    also_training = _trainer("        model.eval()\n        print(rank_users(model, range(9)))") + \
        "model.train()\nprint(rank_users(model, range(9)))\n"
    for train in (back_to_train, no_grad, also_training):
        sources = {"model.py": _SCORER_MODEL, "metrics.py": _RANKER, "train.py": train}
        assert _codes(sources, "TW104") == [], train


_ACCUMULATE = """
import torch

def train(model, loader, optimizer, accum_steps):
    for i, batch in enumerate(loader):
        loss = {loss}
        loss.backward()
        if (i + 1) % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
"""


def test_a_model_output_indexed_by_loss_is_its_mean_loss():
    named = _ACCUMULATE.replace("        loss = {loss}", "        out = model(batch)\n        loss = {loss}")
    for source in (_ACCUMULATE.format(loss='model(**batch)["loss"]'), named.format(loss='out["loss"]')):
        assert len(_codes({"train.py": source}, "TW106")) == 1, source


def test_an_indexed_loss_divided_or_of_another_key_stays_silent():
    for loss in ('model(**batch)["loss"] / accum_steps', 'model(batch)["losses"]', 'model(batch)[0]'):
        assert _codes({"train.py": _ACCUMULATE.format(loss=loss)}, "TW106") == [], loss


_EVAL_EPOCH = """
import torch

def evaluate_split(loader, model):
    model.eval()
    for batch in loader:
        print(model(batch).argmax(-1))

{decorator}
def run(loaders, model, optimizer):
    for epoch in range(3):
        model.train()
        for batch in loaders[0]:
            optimizer.zero_grad()
            model(batch).sum().backward()
            optimizer.step()
        evaluate_split(loaders[1], model)
"""


def test_an_evaluation_called_from_a_registered_or_command_line_entry_point_is_checked():
    for decorator in ('@register_train("example")', "@TRAINERS.register_module()",
                      '@hydra.main(config_path="conf")', "@click.command()"):
        source = "import hydra, click\nfrom registry import register_train, TRAINERS\n" + \
            _EVAL_EPOCH.format(decorator=decorator)
        assert _codes({"train.py": source}, "TW104") == [("train.py", 9)], decorator


def test_an_evaluation_called_under_an_unknown_or_grad_free_decorator_stays_silent():
    for decorator in ("@torch.no_grad()", "@wrappers.in_context", "@torch.inference_mode()"):
        source = "import wrappers\n" + _EVAL_EPOCH.format(decorator=decorator)
        assert _codes({"train.py": source}, "TW104") == [], decorator


_METERS = """
class AverageMeter:
    def __init__(self):
        self.sum, self.count = 0, 0

    def update(self, val, n=1):
        self.sum += val * n
        self.count += n


class History:
    def __init__(self):
        self.points = []

    def record(self, step, value):
        self.points.append((step, value))
"""

_FIT = """
import torch
import torch.nn.functional as F
from utils.meters import AverageMeter, History

def fit(model, loader, optimizer):
    meter, history = AverageMeter(), History()
    for step, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        {keep}
    return meter.sum / meter.count
"""


def test_a_loss_handed_to_a_method_that_adds_it_to_its_object_keeps_every_graph():
    for keep in ("meter.update(loss, x.size(0))", "history.record(step, loss)"):
        sources = {"utils/meters.py": _METERS, "train.py": _FIT.format(keep=keep)}
        assert _codes(sources, "TW102") == [("train.py", 13)], keep


def test_a_number_a_library_object_or_a_method_another_class_defines_differently_stays_silent():
    other = """
class Gauge:
    def update(self, val, n=1):
        self.last = val
"""
    for keep in ("meter.update(loss.item(), x.size(0))", "history.record(step, float(loss))",
                 "metric.update(loss)"):
        fit = _FIT.format(keep=keep).replace("    meter, history", "    metric = torchmetrics.MeanMetric()\n"
                                                                  "    meter, history")
        sources = {"utils/meters.py": _METERS, "train.py": "import torchmetrics\n" + fit}
        assert _codes(sources, "TW102") == [], keep
    sources = {"utils/meters.py": _METERS, "utils/gauge.py": other,
               "train.py": _FIT.format(keep="meter.update(loss, x.size(0))")}
    assert _codes(sources, "TW102") == []


_LOADERS = """
import torch
from torch import nn

def load_weights(model, path):
    found = model.load_state_dict(torch.load(path, weights_only=True), strict=False)
    return found

class Pretrained(nn.Module):
    def load_pretrained(self, path):
        msg = self.load_state_dict(torch.load(path, weights_only=True)["model"], strict=False)
        return msg
"""


def test_a_non_strict_report_returned_to_callers_that_all_drop_it_is_unchecked():
    for call in ("load_weights(net, args.weights)", "net.load_pretrained(args.weights)"):
        train = f"import torch\nfrom nets.base import Pretrained, load_weights\nnet = Pretrained()\n{call}\n"
        found = _codes({"nets/base.py": _LOADERS, "train.py": train}, "TW302")
        assert len(found) == 1 and found[0][0] == "nets/base.py", (call, found)


def test_a_non_strict_report_one_caller_reads_stays_silent():
    train = """
import torch
from nets.base import Pretrained, load_weights
net = Pretrained()
load_weights(net, "a.pt")
print(load_weights(net, "b.pt").missing_keys)
report = net.load_pretrained("c.pt")
assert not report.unexpected_keys
"""
    assert _codes({"nets/base.py": _LOADERS, "train.py": train}, "TW302") == []


_LEARNER = """
import torch
from torch import nn


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv1d(3, 8, 3), {norm}, nn.ReLU())
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.body(x).mean(-1))


class Learner:
    def __init__(self, model, loader):
        self.model = model
        self.loader = loader
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)

    def freeze(self):
        for p in self.model.parameters():
            p.requires_grad = False
        for p in self.model.head.parameters():
            p.requires_grad = True

    def one_epoch(self):
        self.model.train()
        for x, y in self.loader:
            self.opt.zero_grad()
            torch.nn.functional.cross_entropy(self.model(x), y).backward()
            self.opt.step()

    def fit(self, n):
        for _ in range(n):
            self.one_epoch()

    def linear_probe(self, n):
        {probe}


learner = Learner(Backbone(), [])
learner.linear_probe(3)
"""


def test_a_trainer_class_that_freezes_in_one_method_and_trains_in_another_puts_batchnorm_back_in_train_mode():
    for probe in ("self.freeze()\n        self.fit(n)", "self.freeze()\n        for _ in range(n):\n"
                  "            self.one_epoch()"):
        source = _LEARNER.format(norm="nn.BatchNorm1d(8)", probe=probe)
        assert _codes({"learner.py": source}, "TW108") == [("learner.py", 29)], probe


def test_a_freeze_after_training_or_a_model_without_batchnorm_stays_silent():
    after = _LEARNER.format(norm="nn.BatchNorm1d(8)", probe="self.fit(n)\n        self.freeze()")
    no_norm = _LEARNER.format(norm="nn.LayerNorm(6)", probe="self.freeze()\n        self.fit(n)")
    kept_eval = _LEARNER.format(norm="nn.BatchNorm1d(8)", probe="self.freeze()\n        self.fit(n)").replace(
        "        self.model.train()\n", "        self.model.train()\n        self.model.body.eval()\n")
    for source in (after, no_norm, kept_eval):
        assert _codes({"learner.py": source}, "TW108") == [], source


_AMP_HELPER = """
import torch
import torch.nn.functional as F

def loss_step(model, batch, mixed_precision=False):
    x, y = batch
    if mixed_precision:
        with torch.cuda.amp.autocast():
            out = model(x)
    else:
        out = model(x)
    return F.mse_loss(out.float(), y)

def tune(model, loader, optimizer):
    for batch in loader:
        optimizer.zero_grad()
        loss = loss_step(model, batch, {flag})
        loss.backward()
        optimizer.step()
"""


def test_float16_autocast_in_a_loss_helper_whose_result_the_caller_backpropagates():
    unguarded = _AMP_HELPER.replace("    if mixed_precision:\n        with torch.cuda.amp.autocast():\n",
                                    "    with torch.autocast('cuda', dtype=torch.float16):\n").replace(
        "    else:\n        out = model(x)\n", "")
    for source in (_AMP_HELPER.format(flag="mixed_precision=True"), unguarded.format(flag="True")):
        assert len(_codes({"train.py": source}, "TW109")) == 1, source


def test_a_helper_run_without_its_autocast_scaled_or_in_bfloat16_stays_silent():
    off = _AMP_HELPER.format(flag="mixed_precision=False")
    scaled = _AMP_HELPER.format(flag="mixed_precision=True").replace(
        "        loss.backward()\n        optimizer.step()",
        "        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()") + \
        "scaler = torch.amp.GradScaler()\n"
    bf16 = _AMP_HELPER.format(flag="mixed_precision=True").replace(
        "torch.cuda.amp.autocast()", "torch.autocast('cuda', dtype=torch.bfloat16)")
    evaluated = _AMP_HELPER.format(flag="mixed_precision=True").replace("        loss.backward()\n", "")
    for source in (off, scaled, bf16, evaluated):
        assert _codes({"train.py": source}, "TW109") == [], source


_WINDOW = """
import torch

def train(model, loader, opt, k, scaler=None):
    for i, (x, y) in enumerate(loader):
{body}
"""


def test_zero_grad_every_micro_batch_while_stepping_every_k_erases_the_accumulation():
    plain = """        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y) / k
        loss.backward()
        if (i + 1) % k == 0:
            opt.step()"""
    scaled = """        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.mse_loss(model(x), y)
        if scaler:
            scaler.scale(loss / k).backward()
        else:
            (loss / k).backward()
        if i % k == 0:
            if scaler:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()"""
    for body in (plain, scaled):
        assert _codes({"train.py": _WINDOW.format(body=body)}, "TW111") == [("train.py", 6)], body


def test_zero_grad_after_the_step_a_step_with_its_own_backward_or_a_skip_test_stays_silent():
    after_step = """        loss = torch.nn.functional.mse_loss(model(x), y) / k
        loss.backward()
        if (i + 1) % k == 0:
            opt.step()
            opt.zero_grad()"""
    own_backward = """        opt.zero_grad()
        if i % k == 0:
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        other = model(x).sum()
        other.backward()"""
    skip = """        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if torch.isfinite(loss):
            opt.step()"""
    for body in (after_step, own_backward, skip):
        assert _codes({"train.py": _WINDOW.format(body=body)}, "TW111") == [], body


_PLANNER = """
import torch


class Planner:
    def __init__(self, network, path):
        self.network = network
        self.path = path

    def initialize(self):
        self.network.load_state_dict(torch.load(self.path, weights_only=True))
        self.network.eval()

    {decorator}
    def plan(self, observation):
        outputs = self.network(torch.as_tensor(observation))
        return outputs.detach().cpu().numpy()
"""


def test_an_inference_class_running_its_eval_mode_model_with_autograd_on():
    source = _PLANNER.format(decorator="")
    assert _codes({"planner.py": source}, "TW104") == [("planner.py", 16)]
    caller = "from planner import Planner\np = Planner(net, 'w.pt')\np.initialize()\nprint(p.plan(obs))\n"
    assert _codes({"planner.py": source, "run.py": caller}, "TW104") == [("planner.py", 16)]


def test_an_inference_class_under_no_grad_put_back_in_train_mode_or_differentiated_by_a_caller_stays_silent():
    no_grad = _PLANNER.format(decorator="@torch.no_grad()")
    trained = _PLANNER.format(decorator="").replace("        self.network.eval()\n",
                                                    "        self.network.eval()\n\n    def tune(self):\n"
                                                    "        self.network.train()\n")
    for source in (no_grad, trained):
        assert _codes({"planner.py": source}, "TW104") == [], source
    guidance = """
import torch
from planner import Planner
critic = Planner(net, "w.pt")
critic.initialize()
image = torch.zeros(3, requires_grad=True)
for _ in range(10):
    score = critic.plan(image)
    score.sum().backward()
"""
    assert _codes({"planner.py": _PLANNER.format(decorator=""), "guide.py": guidance}, "TW104") == []


# A module whose float16 comes from a value: CLIP's loader, a builder ending in .half(), a dtype copied.
_PROBE_SCRIPT = """
import clip
import torch
from torch import nn

backbone, preprocess = clip.load("ViT-B/16"{device})
probe = nn.Linear(512, 37, bias=False){cast}
opt = torch.optim.SGD(probe.parameters(), lr=1e-3)
for images, labels in loader:
    with torch.no_grad():
        feats = backbone.encode_image(images)
    loss = torch.nn.functional.cross_entropy(probe(feats), labels)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

_FINETUNE = """
import torch
from torch import nn

def finetune(encoder, loader, steps):
    head = nn.Linear(encoder.width, 10).type(encoder.dtype)
    head.cuda()
    optim = torch.optim.AdamW(head.parameters(), lr=3e-4)
    for step, (x, y) in zip(range(steps), loader):
        logits = head(encoder(x))
        loss = nn.functional.cross_entropy(logits, y)
        optim.zero_grad()
        loss.backward()
        optim.step()
"""

_RUN_FINETUNE = """
from clip import clip
from tuning.head import finetune

def main(loader):
    model, _ = clip.load("RN50")
    model.eval()
    finetune(model, loader, 1000)
{more}
"""

_HALF_BUILDER = """
import torch
from torch import nn

class Tower(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 1))

    def forward(self, x):
        return self.mlp(x)

def make_tower(half=True):
    tower = Tower().cuda()
    {cast}
    return tower
"""

_TRAIN_TOWER = """
import torch
from nets.tower import make_tower

net = make_tower()
optimizer = torch.optim.Adam(net.parameters(), lr=1e-4)
for x, y in batches:
    loss = (net(x) - y).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_a_module_cast_to_the_dtype_of_a_clip_model_or_built_half_by_a_builder_trains_in_float16():
    assert _codes({"probe.py": _PROBE_SCRIPT.format(device="", cast=".to(backbone.dtype)")}, "TW109") == [
        ("probe.py", 7)]
    copied = _PROBE_SCRIPT.format(device=', device="cuda"', cast="\ndtype = backbone.dtype\nprobe.to(dtype=dtype)")
    assert _codes({"probe.py": copied}, "TW109") == [("probe.py", 9)]
    project = {"tuning/head.py": _FINETUNE, "run.py": _RUN_FINETUNE.format(more="")}
    assert _codes(project, "TW109") == [("tuning/head.py", 6)]
    built = {"nets/tower.py": _HALF_BUILDER.format(cast="tower = tower.half()"), "train.py": _TRAIN_TOWER}
    assert _codes(built, "TW109") == [("train.py", 5)]


def test_a_dtype_not_known_float16_or_a_float16_module_never_trained_or_scaled_stays_silent():
    on_cpu = _PROBE_SCRIPT.format(device=', device="cpu"', cast=".to(backbone.dtype)")
    device_unknown = _PROBE_SCRIPT.format(device=", device=args.device", cast=".to(backbone.dtype)")
    cast_back = _PROBE_SCRIPT.format(device="", cast=".to(backbone.dtype)").replace(
        'preprocess = clip.load("ViT-B/16")', 'preprocess = clip.load("ViT-B/16")\nbackbone.float()')
    scaled = _PROBE_SCRIPT.format(device="", cast=".to(backbone.dtype)").replace(
        "    loss.backward()\n    opt.step()", "    scaler.scale(loss).backward()\n    scaler.step(opt)") + \
        "scaler = torch.cuda.amp.GradScaler()\n"
    inference = _PROBE_SCRIPT.format(device="", cast=".to(backbone.dtype)").replace(
        "    loss.backward()\n", "")
    in_a_lambda = "import torch\ncast = lambda m, d: m.to(d) if d else m.half()\n"
    for source in (on_cpu, device_unknown, cast_back, scaled, inference, in_a_lambda):
        assert _codes({"probe.py": source}, "TW109") == [], source
    # one caller passes a float32 model: the parameter is not known float16
    mixed = {"tuning/head.py": _FINETUNE, "run.py": _RUN_FINETUNE.format(
        more="\ndef baseline(loader, net):\n    finetune(net.float(), loader, 10)\n")}
    assert _codes(mixed, "TW109") == []
    for cast in ("tower = tower.float()", "if half:\n        return tower.half()", "tower.train()"):
        built = {"nets/tower.py": _HALF_BUILDER.format(cast=cast), "train.py": _TRAIN_TOWER}
        assert _codes(built, "TW109") == [], cast


# An evaluation that puts only parts of the model it runs in eval mode: the rest keeps its dropout on.
_TAGGER = """
import torch
from torch import nn

class Tagger(nn.Module):
    def __init__(self, vocab, dim, tags):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.encoder = {encoder}
        self.classifier = nn.Linear(dim, tags)

    def forward(self, tokens):
        return self.classifier(self.encoder(self.embed(tokens)))
"""

_ENGINE = """
import torch

def evaluate(net, loader):
    net.embed.eval()
    net.classifier.eval()
    hits = total = 0
    with torch.no_grad():
        for tokens, tags in loader:
            hits += (net(tokens).argmax(-1) == tags).sum().item()
            total += tags.numel()
    net.train()
    return hits / total
"""

_FIT_TAGGER = """
import torch
from nets.tagger import Tagger
from engine import evaluate

model = Tagger(30000, 256, 17)
opt = torch.optim.Adam(model.parameters())
for epoch in range(10):
    for tokens, tags in train_loader:
        loss = torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), tags.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
{before}    print(evaluate(model, val_loader))
"""

_LAYERS = "nn.TransformerEncoder(nn.TransformerEncoderLayer(dim, 8, batch_first=True), 4)"

_READER = """
import torch
from torch import nn
from transformers import BertModel

class Reader(nn.Module):
    def __init__(self):
        super().__init__()
        self.bert = BertModel.from_pretrained("bert-base-uncased")
        self.span = nn.Linear(768, 2)

    def forward(self, ids, mask):
        return self.span(self.bert(ids, attention_mask=mask).last_hidden_state)

@torch.no_grad()
def validate(model, loader, full_finetune):
    if full_finetune:
        model.eval()
    else:
        model.span.eval()
    losses = [model(ids, mask).logsumexp(-1).mean().item() for ids, mask in loader]
    return sum(losses) / len(losses)

reader = Reader()
optimizer = torch.optim.AdamW(reader.span.parameters(), lr=1e-4)
for ids, mask in train_loader:
    optimizer.zero_grad()
    reader(ids, mask).mean().backward()
    optimizer.step()
score = validate(reader, dev_loader, args.full)
"""


def test_an_evaluation_that_puts_only_parts_of_the_model_in_eval_mode_leaves_its_dropout_on():
    project = {"nets/tagger.py": _TAGGER.format(encoder=_LAYERS), "engine.py": _ENGINE,
               "fit.py": _FIT_TAGGER.format(before="")}
    assert _codes(project, "TW103") == [("engine.py", 5)]
    assert _codes({"reader.py": _READER}, "TW103") == [("reader.py", 20)]
    dropout = "nn.Sequential(nn.Linear(dim, dim), nn.Dropout(0.3), nn.GELU())"
    project["nets/tagger.py"] = _TAGGER.format(encoder=dropout)
    assert _codes(project, "TW103") == [("engine.py", 5)]


def test_parts_in_eval_mode_with_nothing_else_mode_dependent_or_the_whole_model_in_eval_stays_silent():
    mode_free = {"nets/tagger.py": _TAGGER.format(encoder="nn.Sequential(nn.Linear(dim, dim), nn.LayerNorm(dim))"),
                 "engine.py": _ENGINE, "fit.py": _FIT_TAGGER.format(before="")}
    no_rate = dict(mode_free, **{"nets/tagger.py": _TAGGER.format(encoder="nn.Dropout(p=0.0)")})
    caller_evals = {"nets/tagger.py": _TAGGER.format(encoder=_LAYERS), "engine.py": _ENGINE,
                    "fit.py": _FIT_TAGGER.format(before="    model.eval()\n")}
    same_path = {"nets/tagger.py": _TAGGER.format(encoder=_LAYERS), "fit.py": _FIT_TAGGER.format(before=""),
                 "engine.py": _ENGINE.replace("    net.embed.eval()\n", "    net.eval()\n    net.embed.eval()\n")}
    unknown = {"nets/tagger.py": _TAGGER.format(encoder=_LAYERS), "engine.py": _ENGINE,
               "fit.py": _FIT_TAGGER.format(before="") + "\ndef check(other):\n    evaluate(other, val_loader)\n"}
    for project in (mode_free, no_rate, caller_evals, same_path, unknown):
        assert _codes(project, "TW103") == [], project
    branches = "    if full_finetune:\n        model.eval()\n    else:\n        model.span.eval()\n"
    for source in (_READER.replace('BertModel.from_pretrained("bert-base-uncased")', "nn.Linear(768, 768)"),
                   _READER.replace("        model.span.eval()", "        model.bert.eval()\n        model.span.eval()"),
                   _READER.replace(branches, "    model.span.eval()\n    model.eval()\n")):
        assert _codes({"reader.py": source}, "TW103") == [], source


_MIXER = """
import torch
from torch import nn


class MixerBlock(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.mix = nn.Conv1d(width, width, 1)
        self.norm = {norm}

    def forward(self, x):
        return self.norm(torch.relu(self.mix(x)))


class SeriesEncoder(nn.Module):
    def __init__(self, width, depth):
        super().__init__()
        self.blocks = nn.ModuleList([MixerBlock(width) for _ in range(depth)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


class Forecaster(nn.Module):
    def __init__(self, width=16, depth=3, horizon=4):
        super().__init__()
        self.encoder = SeriesEncoder(width, depth)
        self.projection = nn.Linear(width, horizon)
{extra}
    def forward(self, x):
        return self.projection(self.encoder(x).mean(-1))
"""


_RUNNER = """
import torch
import torch.nn.functional as F


class Runner:
    def __init__(self, data, net, lr=1e-3):
        self.net, self.data, self.lr = net, data, lr
        self.opt = torch.optim.Adam(self.net.parameters(), lr=lr)

    def lock(self):
        for w in self.net.parameters():
            w.requires_grad = False
        for w in self.net.projection.parameters():
            w.requires_grad = True

    def unlock(self):
        for w in self.net.parameters():
            w.requires_grad = True

    def epoch(self):
        self.net.train()
        for x, y in self.data:
            self.opt.zero_grad()
            F.mse_loss(self.net(x), y).backward()
            self.opt.step()

    def run(self, epochs):
        for _ in range(epochs):
            self.epoch()

    def probe(self, epochs):
        {probe}
"""


_RESTORE = """
import torch


def restore(model, path, device="cpu"):
    state = torch.load(path, map_location=device, weights_only=True)
    model.load_state_dict(state)
    model = model.to(device)
    return model
"""


_PROBE = """
from engine.runner import Runner
from nets.mixer import Forecaster
from utils.io import restore

net = Forecaster(width=32)
net = restore(net, "pretrained.pt")
Runner(loader, net).probe(5)
"""


def _mixer_run(norm="nn.BatchNorm1d(width)", probe="self.lock()\n        self.run(epochs)", extra="",
               script=_PROBE, restore=_RESTORE) -> dict[str, str]:
    return {"nets/mixer.py": _MIXER.format(norm=norm, extra=extra), "engine/runner.py": _RUNNER.format(probe=probe),
            "utils/io.py": restore, "probe.py": script}


def test_a_runner_of_another_file_learns_what_its_model_holds_where_it_is_constructed():
    assert _codes(_mixer_run(), "TW108") == [("engine/runner.py", 22)]
    keyword = _PROBE.replace("Runner(loader, net)", "Runner(net=restore(Forecaster(), 'p.pt'), data=loader)")
    assert _codes(_mixer_run(script=keyword), "TW108") == [("engine/runner.py", 22)]


def test_a_loader_that_hands_its_argument_back_keeps_what_the_model_holds():
    script = """
import torch
import torchvision
from utils.io import restore

model = torchvision.models.resnet50()
model = restore(model, "imagenet.pt")
for p in model.parameters():
    p.requires_grad = False
model.fc = torch.nn.Linear(2048, 5)
optimizer = torch.optim.SGD(model.fc.parameters(), lr=0.01)
for epoch in range(3):
    model.train()
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
"""
    assert _codes({"utils/io.py": _RESTORE, "finetune.py": script}, "TW108") == [("finetune.py", 13)]


def test_a_runner_whose_model_has_no_batchnorm_keeps_eval_or_is_unknown_stays_silent():
    kept = ("\n    def train(self, mode=True):\n        super().train(mode)\n        self.encoder.eval()\n"
            "        return self\n")
    fresh = _RESTORE.replace("    model = model.to(device)\n    return model\n",
                             "    plain = torch.nn.Sequential(torch.nn.Conv1d(16, 16, 1), torch.nn.Linear(16, 4))\n"
                             "    plain.load_state_dict(model.state_dict())\n    return plain\n")
    unknown = _PROBE.replace("from nets.mixer import Forecaster", "from tsmodels import Forecaster")
    unlocked = "self.lock()\n        self.unlock()\n        self.run(epochs)"
    for run in (_mixer_run(norm="nn.LayerNorm(width)"), _mixer_run(extra=kept), _mixer_run(restore=fresh),
                _mixer_run(script=unknown), _mixer_run(probe=unlocked)):
        assert _codes(run, "TW108") == [], run


def test_a_model_whose_class_of_another_file_keeps_its_frozen_part_in_eval_stays_silent():
    nets = """
import torch.nn as nn


class Tower(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
        self.fc = nn.Linear(8, 2)

    def freeze_trunk(self):
        self.trunk.requires_grad_(False)
{override}

def make_tower():
    tower = Tower()
    return tower
"""
    override = ("\n    def train(self, mode=True):\n        super().train(mode)\n        self.trunk.eval()\n"
                "        return self\n")
    script = """
import torch
from nets import make_tower
from loop import one_epoch

model = make_tower()
model.freeze_trunk()
opt = torch.optim.SGD(model.fc.parameters(), lr=0.1)
for epoch in range(3):
    one_epoch(model, loader, opt)
"""
    loop = """
import torch.nn.functional as F


def one_epoch(net, batches, opt):
    net.train()
    for x, y in batches:
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
"""
    run = {"nets.py": nets.format(override=""), "train.py": script, "loop.py": loop}
    assert _codes(run, "TW108") == [("train.py", 7)]
    run["nets.py"] = nets.format(override=override)
    assert _codes(run, "TW108") == []


_SPLIT_EPOCH = """    def epoch(self):
        self.net.train()
        self.each_batch()

    def each_batch(self):
        for x, y in self.data:
            self.step(x, y)

    def step(self, x, y):
        self.opt.zero_grad()
        {step}
"""


def test_a_train_call_followed_by_a_helper_whose_loop_trains_is_in_a_training_epoch():
    run = _mixer_run()
    epoch = run["engine/runner.py"]
    start, end = epoch.index("    def epoch(self):"), epoch.index("    def run(self")
    split = epoch[:start] + _SPLIT_EPOCH.format(step="F.mse_loss(self.net(x), y).backward()\n        self.opt.step()\n")
    run["engine/runner.py"] = split + "\n" + epoch[end:]
    assert _codes(run, "TW108") == [("engine/runner.py", 22)]
    forward_only = epoch[:start] + _SPLIT_EPOCH.format(step="self.samples.append(self.net(x))\n")
    run["engine/runner.py"] = forward_only + "\n" + epoch[end:]
    assert _codes(run, "TW108") == []


_CAPTIONER = """
import torch
from torch import nn
from transformers import {encoder}


class Captioner(nn.Module):
    def __init__(self, vocab=1000):
        super().__init__()
        self.text = {encoder}.from_pretrained("{checkpoint}")
        self.fuse = nn.Sequential(nn.Linear(768, 256), {drop}nn.GELU())
        self.head = nn.Linear(256, vocab)

    def forward(self, ids, feats):
        return self.head(self.fuse(self.text(ids).last_hidden_state.mean(1) + feats))
"""


_CAPTION_TRAIN = """
import torch
from models import Captioner

model = Captioner()
for p in model.{part}.parameters():
    p.requires_grad = False
{evaluate}
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
for epoch in range(10):
    model.train()
    for ids, feats, target in loader:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(ids, feats), target).backward()
        optimizer.step()
"""


def _captions(encoder="T5EncoderModel", checkpoint="google/flan-t5-base", drop="", part="text",
              evaluate="model.text.eval()") -> dict[str, str]:
    return {"models.py": _CAPTIONER.format(encoder=encoder, checkpoint=checkpoint, drop=drop),
            "train.py": _CAPTION_TRAIN.format(part=part, evaluate=evaluate)}


def test_a_frozen_part_put_in_eval_then_back_in_train_mode_runs_its_dropout():
    assert _codes(_captions(), "TW108") == [("train.py", 11)]
    assert _codes(_captions(encoder="BertModel", checkpoint="bert-base-uncased"), "TW108") == [("train.py", 11)]
    fused = _captions(drop="nn.Dropout(0.2), ", part="fuse", evaluate="model.fuse.eval()")
    assert _codes(fused, "TW108") == [("train.py", 11)]


def test_a_frozen_part_put_in_eval_in_init_only_runs_its_dropout_after_train():
    frozen_in_init = _CAPTIONER.format(encoder="T5EncoderModel", checkpoint="t5-small", drop="").replace(
        "        self.head = nn.Linear(256, vocab)\n",
        "        self.head = nn.Linear(256, vocab)\n        self.text.requires_grad_(False)\n"
        "        self.text.eval()\n")
    assert _codes({"models.py": frozen_in_init}, "TW108") == [("models.py", 14)]


def test_a_frozen_part_without_dropout_or_never_put_in_eval_or_kept_in_eval_stays_silent():
    kept = _captions()
    kept["train.py"] = kept["train.py"].replace("    model.train()\n", "    model.train()\n    model.text.eval()\n")
    for run in (_captions(encoder="CLIPTextModel", checkpoint="openai/clip-vit-base-patch32"),
                _captions(evaluate=""), kept,
                _captions(part="fuse", evaluate="model.fuse.eval()"),
                _captions(drop="nn.Dropout(0.0), ", part="fuse", evaluate="model.fuse.eval()"),
                _captions(encoder="FluxTransformer2DModel", checkpoint="flux")):
        assert _codes(run, "TW108") == [], run


_PREPARED = """
import torch
import torchvision
from accelerate import Accelerator
from helpers import freeze_bn

accelerator = Accelerator()
model = torchvision.models.resnet18(weights="DEFAULT")
model.requires_grad_(False)
model.fc = torch.nn.Linear(512, 3)
optimizer = torch.optim.SGD(model.fc.parameters(), lr=0.1)
model, optimizer, loader = {prepare}(model, optimizer, loader)
for epoch in range(5):
    model.train()
    for x, y in loader:
        optimizer.zero_grad()
        accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))
        {clip}
        grad_size = sum(p.grad.norm(2).item() for p in model.parameters() if p.grad is not None)
        optimizer.step()
"""


def test_a_model_handed_back_by_accelerate_and_a_loop_that_clips_or_measures_norms_still_trains_batchnorm():
    for clip in ("accelerator.clip_grad_norm_(model.parameters(), 1.0)",
                 "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)"):
        source = _PREPARED.format(prepare="accelerator.prepare", clip=clip)
        assert _codes({"train.py": source}, "TW108") == [("train.py", 14)], clip
    captions = _captions()
    captions["train.py"] = captions["train.py"].replace(
        "optimizer = torch.optim", "from accelerate import Accelerator\nacc = Accelerator()\noptimizer = torch.optim"
    ).replace("for epoch in range(10):", "model, optimizer = acc.prepare(model, optimizer)\nfor epoch in range(10):")
    assert _codes(captions, "TW108") == [("train.py", 14)]


def test_a_model_handed_to_an_unknown_preparer_or_to_a_norm_helper_after_train_stays_silent():
    unknown = _PREPARED.format(prepare="toolkit.prepare", clip="pass")
    helper = _PREPARED.format(prepare="accelerator.prepare", clip="model = freeze_bn(model)")
    captions = _captions()
    captions["train.py"] = captions["train.py"].replace(
        "for epoch in range(10):", "model, optimizer = toolkit.prepare(model, optimizer)\nfor epoch in range(10):")
    for run in ({"train.py": unknown}, {"train.py": helper}, captions):
        assert _codes(run, "TW108") == [], run


def test_torch_init_functions_named_like_norms_do_not_keep_a_frozen_part_in_eval():
    nets = """
import torch.nn as nn


class Tower(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
        self.fc = nn.Linear(8, 2)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
"""
    script = """
import torch
from nets import Tower

net = Tower()
for p in net.trunk.parameters():
    p.requires_grad = False
opt = torch.optim.Adam([p for p in net.parameters() if p.requires_grad])
for epoch in range(3):
    net.train()
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
"""
    assert _codes({"nets.py": nets, "train.py": script}, "TW108") == [("train.py", 10)]


_EVALUATOR = '''
import torch


class Evaluator:
    def __init__(self, model, loader):
        self.model = model
        self.loader = loader

    def {helper}(self, batch):
        return [float(x.sum()) for x in batch]

    {decorator}
    def {member}(self):
        return self.model

    def evaluate(self):
        scores = []
        for batch in self.loader:
            scores.append(self.{helper}(batch))
            {forward}
        return scores
'''


def test_a_method_of_the_class_named_like_a_model_is_no_model_in_an_evaluation_loop():
    """``self._model_scores(batch)`` calls a method the class itself defines: it runs no module's forward,
    whatever its name, so TW103 has nothing to put in eval mode (was a false alarm on the doctor's own code)."""
    for helper in ("_model_scores", "model_outputs", "net_stats"):
        source = _EVALUATOR.format(helper=helper, decorator="", member="model_of", forward="pass")
        assert _codes({"evaluate.py": source}, "TW103") == [], helper


def test_a_property_that_hands_back_the_model_is_still_the_model_in_an_evaluation_loop():
    """The near-miss the other way: ``self.net(batch)`` through a ``@property`` returning the model is a forward,
    and one without ``.eval()`` in an evaluation loop is still reported."""
    source = _EVALUATOR.format(helper="_stats", decorator="@property", member="net", forward="self.net(batch)")
    assert _codes({"evaluate.py": source}, "TW103") != []
