"""``load_weights`` on a peft adapter written by ``peft_model.save_pretrained``, into a fresh peft model.

peft saves only the adapter's tensors, without the adapter name (``q_proj.lora_A.weight`` for the model's
``q_proj.lora_A.default.weight``), under ``base_model.model.``; the base weights are not in the file. The
tensors must land in the active adapter, agree with what peft's own ``PeftModel.from_pretrained`` loads, and
a strict load must not count the base weights as missing. A report never suggests ``strict=False`` when that
would load nothing.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from hf_models import tiny_bert_classifier, tiny_llama, token_batches

import trainwise as tw
from trainwise.checkpoint import WeightsMismatchError

peft = pytest.importorskip("peft")
pytest.importorskip("transformers")

TARGETS = ["q_proj", "v_proj"]


def _lora(base: torch.nn.Module, *, seed: int, targets=TARGETS, **options):
    torch.manual_seed(seed)  # the adapter's own initialisation
    return peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, **options))


def _batch() -> dict[str, torch.Tensor]:
    samples = token_batches(4, seed=1, ragged=False)
    return {key: torch.stack([s[key] for s in samples]) for key in samples[0]}


def _adapter(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if "lora_" in k}


@torch.no_grad()
def _logits(model: torch.nn.Module) -> torch.Tensor:
    batch = _batch()
    return model.eval()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A LoRA on the tiny Llama, trained two steps (lora_B starts at zero), saved with save_pretrained."""
    tmp_path = tmp_path_factory.mktemp("peft")
    model = _lora(tiny_llama(seed=0), seed=0)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):
        model(**_batch()).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert all(v.abs().sum() > 0 for v in _adapter(model).values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    return model, tmp_path / "adapter"


@pytest.mark.parametrize("form", ["file", "folder"])
def test_adapter_loads_into_a_fresh_peft_model(trained, form):
    model, folder = trained
    fresh = _lora(tiny_llama(seed=0), seed=1)  # same base weights, another adapter initialisation
    assert not torch.equal(_logits(fresh), _logits(model))
    source = folder / "adapter_model.safetensors" if form == "file" else folder
    report = tw.load_weights(fresh, source)  # strict: the base weights are not in an adapter file
    assert report.ok and report.adapter == "default" and len(report.loaded) == 8
    assert report.source == str(folder / "adapter_model.safetensors")
    assert len(report.kept) == len(fresh.state_dict()) - 8 and not report.missing
    assert str(report).startswith(f"load_weights from {report.source}: all 8 tensors of adapter 'default' loaded")
    saved, loaded = _adapter(model), _adapter(fresh)
    assert saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved)
    assert torch.equal(_logits(fresh), _logits(model))

    own = peft.PeftModel.from_pretrained(tiny_llama(seed=0), folder)  # what peft itself loads: the same
    assert all(torch.equal(v, own.state_dict()[k]) for k, v in fresh.state_dict().items())


def test_adapter_with_modules_to_save_matches_peft(tmp_path):
    """A classifier LoRA (task_type SEQ_CLS) also saves the head that modules_to_save copies."""
    def build(seed):
        torch.manual_seed(seed)
        return peft.get_peft_model(tiny_bert_classifier(seed=0),
                                   peft.LoraConfig(task_type="SEQ_CLS", r=4, target_modules=["query", "value"]))

    model = build(0)
    with torch.no_grad():
        for value in _adapter(model).values():
            value.normal_()
        model.base_model.model.classifier.modules_to_save["default"].weight.normal_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(tmp_path)
    fresh = build(1)
    report = tw.load_weights(fresh, tmp_path)
    assert report.ok and len(report.loaded) == 10  # 8 LoRA tensors and the copied head's weight and bias
    assert "base_model.model.classifier.modules_to_save.default.weight" in report.loaded
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in fresh.state_dict().items())


def test_strict_adapter_load_requires_every_adapter_tensor(trained):
    _, folder = trained
    wider = _lora(tiny_llama(seed=0), seed=1, targets=[*TARGETS, "k_proj"])  # 4 more adapter tensors
    with pytest.raises(WeightsMismatchError) as info:
        tw.load_weights(wider, folder)
    report = info.value.report
    assert report.adapter == "default" and len(report.missing) == 4 and all("k_proj" in k for k in report.missing)
    first = str(info.value).splitlines()[0]
    assert "4 of 12 keys of adapter 'default' did not load" in first and "pass strict=False" in first


@pytest.mark.parametrize("strict", [True, False])
def test_a_file_that_loads_nothing_never_suggests_strict_false(trained, strict):
    _, folder = trained
    other = _lora(tiny_llama(seed=0), seed=1, targets=["k_proj", "o_proj"])  # no key in common
    path = folder / "adapter_model.safetensors"
    if strict:
        with pytest.raises(WeightsMismatchError) as info:
            tw.load_weights(other, path)
        report, text = info.value.report, str(info.value)
    else:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report = tw.load_weights(other, path, strict=False)
        text = str(report)
        warned = [str(w.message) for w in caught if str(w.message).startswith("load_weights:")]
        assert len(warned) == 1 and "strict=False" not in warned[0]
    assert report.loaded == [] and "strict=False" not in text
    assert "the checkpoint is for another kind of model" in text.splitlines()[0]


def test_adapter_into_a_model_without_peft_says_so(trained):
    _, folder = trained
    plain = tiny_llama(seed=0)
    with pytest.raises(tw.TrainwiseError, match=r"holds a peft adapter \(adapter_model.safetensors\)"):
        tw.load_weights(plain, folder)
    with pytest.raises(WeightsMismatchError) as info:
        tw.load_weights(plain, folder / "adapter_model.safetensors")
    first = str(info.value).splitlines()[0]
    assert "strict=False" not in first and "peft adapter weights (lora_ keys)" in first


def test_full_peft_state_dict_still_needs_every_key(trained):
    """A whole peft model's state dict (adapter names in the keys) is a full load, not an adapter load."""
    model, _ = trained
    fresh = _lora(tiny_llama(seed=0), seed=1)
    report = tw.load_weights(fresh, model.state_dict())
    assert report.ok and report.adapter is None and len(report.loaded) == len(fresh.state_dict())
    partial = dict(model.state_dict())
    partial.pop("base_model.model.lm_head.weight")
    with pytest.raises(WeightsMismatchError, match="1 of 29 model keys did not load"):
        tw.load_weights(fresh, partial)
