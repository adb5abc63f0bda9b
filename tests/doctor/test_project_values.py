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
