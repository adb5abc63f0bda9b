"""A collate function that draws random numbers (BERT's masking collator, a noise-adding ``collate_fn``) resumes
bitwise: each batch is collated from the random state its own position gives it, whether it is collated ahead
of the step, after a resume, in the main process or in a worker."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from hf_models import tiny_bert_mlm

import trainwise as tw

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")


def _tokenizer():
    words = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran"]
    vocab = {"[PAD]": 0, "[UNK]": 1, "[MASK]": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                                mask_token="[MASK]")


def _samples(n=48):
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(n):
        length = int(torch.randint(4, 12, (1,), generator=g))
        ids = torch.randint(3, 11, (length,), generator=g).tolist()
        out.append({"input_ids": ids, "attention_mask": [1] * length})
    return out


def _noisy_collate(rows):
    """A hand-written collate that pads and adds noise to the embeddings' input: masks 20% at random."""
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.tensor([r["input_ids"] + [0] * (width - len(r["input_ids"])) for r in rows])
    mask = torch.tensor([r["attention_mask"] + [0] * (width - len(r["attention_mask"])) for r in rows])
    chosen = (torch.rand(ids.shape) < 0.2) & mask.bool()
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    return {"input_ids": torch.where(chosen, torch.full_like(ids, 2), ids), "attention_mask": mask, "labels": labels}


def _data(source):
    if source == "list":
        return _samples()
    datasets = pytest.importorskip("datasets")
    return datasets.Dataset.from_list(_samples())  # batched fetch (__getitems__), as `.map(tokenize)` gives


class _Killed(Exception):
    """Stands for SIGKILL: no checkpoint of its own, the run resumes from the last periodic one."""


def _fit(run_dir, collate, *, interrupt_at=None, resume=None, workers=0, source="list", kill=False):
    calls = {"n": 0}

    def build():
        model = tiny_bert_mlm(seed=0)
        model.config.hidden_dropout_prob = 0.1  # BERT pre-training's dropout: the model draws too
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.1
        if interrupt_at is not None:
            def count(module, args, kwargs):
                if module.training:
                    calls["n"] += 1
                    if calls["n"] == interrupt_at:
                        if kill == "signal":  # Ctrl-C from the terminal: the step ends, then the run stops
                            os.kill(os.getpid(), signal.SIGINT)
                        else:
                            raise _Killed if kill else KeyboardInterrupt
            model.register_forward_pre_hook(count, with_kwargs=True)
        return model

    try:
        result = tw.Trainer(epochs=2, batch_size=8, seed=0, lr=1e-2, deterministic=True, collate_fn=collate,
                            checkpoint_every=1,
                            run_dir=str(run_dir), progress="off", plot=False, device="cpu", resume=resume,
                            num_workers=workers).fit(build, _data(source))
    except KeyboardInterrupt as exc:
        result = exc.result
    except _Killed:
        result = None
    return result


@pytest.mark.parametrize("source", ["list", "datasets"])
@pytest.mark.parametrize("kind", ["masking_collator", "noisy_collate_fn"])
@pytest.mark.parametrize("kill", [False, "signal", True], ids=["interrupt", "sigint", "killed"])
def test_a_random_collate_resumes_bitwise(tmp_path, kind, source, kill):
    collate = (transformers.DataCollatorForLanguageModeling(_tokenizer(), mlm=True, mlm_probability=0.3)
               if kind == "masking_collator" else _noisy_collate)
    full = _fit(tmp_path / "full", collate, source=source)
    cut = _fit(tmp_path / "cut", collate, interrupt_at=7, source=source, kill=kill)
    assert kill is True or cut.stopped == "interrupted"
    resumed = _fit(tmp_path / "cut", collate, resume="auto", source=source)
    for (name, a), b in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


def _batches(loader, *, draw_between=False):
    out = []
    for batch in loader:
        out.append({k: v.clone() for k, v in batch.items()})
        if draw_between:  # the training loop draws (dropout) between batches: no effect on the next batch
            torch.rand(100)
    return out


@pytest.mark.slow
def test_a_random_collate_draws_the_same_in_workers_and_in_the_main_process():
    from trainwise.data import seeded_loader

    def batches(workers, **kw):
        torch.manual_seed(123 + workers)  # the caller's RNG state does not matter either
        return _batches(seeded_loader(_samples(), batch_size=8, seed=0, num_workers=workers,
                                      collate_fn=_noisy_collate), **kw)

    reference = batches(0)
    for other in (batches(0, draw_between=True), batches(2)):
        assert len(other) == len(reference)
        for a, b in zip(reference, other):
            assert all(torch.equal(a[k], b[k]) for k in a)
