"""The conformance suite's shared pieces: tiny models of the real libraries, built from configs (random
weights, no download), and an environment that cannot reach the Hub.

Every test in tests/ecosystem/ imports the real ``transformers``, ``datasets``, ``peft``, ``accelerate`` or
``lightning`` (the ``ecosystem`` extra; ``dev`` includes it), never a look-alike class.
"""

from __future__ import annotations

import os

import pytest
import torch

# set before transformers or datasets are imported: no test may reach the Hub, and none needs to
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

VOCAB = 61  # small and odd, so that no shape coincides by chance


def tiny_gpt2(*, seed: int = 0, vocab: int = VOCAB):
    """A 2-layer GPT-2 causal LM (shifts its labels inside ``forward``)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=vocab, n_positions=32, n_embd=16, n_layer=2, n_head=2,
                                     bos_token_id=0, eos_token_id=0,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config)


def tiny_llama(*, seed: int = 0, vocab: int = VOCAB):
    """A 2-layer Llama causal LM."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(config)


def tiny_bert_config(*, vocab: int = VOCAB, num_labels: int = 3):
    transformers = pytest.importorskip("transformers")
    return transformers.BertConfig(vocab_size=vocab, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=32, max_position_embeddings=32, num_labels=num_labels,
                                   hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def tiny_bert_classifier(*, seed: int = 0, num_labels: int = 3, dropout: float = 0.0):
    """A 2-layer BERT sequence classifier (``BertForSequenceClassification``, base model under ``bert.``)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    config = tiny_bert_config(num_labels=num_labels)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = dropout
    return transformers.BertForSequenceClassification(config)


def tiny_bert_mlm(*, seed: int = 0):
    """A 2-layer BERT masked LM (labels not shifted; -100 where no token is masked)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    return transformers.BertForMaskedLM(tiny_bert_config())


def token_batches(n: int, *, length: int = 12, seed: int = 0, vocab: int = VOCAB, ragged: bool = True):
    """``n`` samples of ``{"input_ids", "attention_mask", "labels"}`` with lengths that differ (so token counts
    differ between micro-batches), padded with -100 labels and mask 0 to ``length``."""
    g = torch.Generator().manual_seed(seed)
    samples = []
    for _ in range(n):
        real = int(torch.randint(3, length + 1, (1,), generator=g)) if ragged else length
        ids = torch.randint(1, vocab, (length,), generator=g)
        mask = (torch.arange(length) < real).long()
        labels = torch.where(mask.bool(), ids, torch.full_like(ids, -100))
        samples.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return samples


@pytest.fixture(autouse=True)
def _restore_torch_state():
    """Leave torch's RNG, threads and determinism switches as they were."""
    rng = torch.random.get_rng_state()
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    yield
    torch.random.set_rng_state(rng)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)
