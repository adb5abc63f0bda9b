"""Tiny models of the real libraries, built from configs (random weights, no download), and data for them."""

from __future__ import annotations

import pytest
import torch

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


def word_tokenizer(words=("the", "cat", "sat", "on", "mat", "a", "dog", "ran")):
    """A real ``PreTrainedTokenizerFast`` over a word-level vocabulary built here (no download)."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]")


def sentences(n: int, *, seed: int = 0):
    """``n`` (text, label) rows of different lengths."""
    g = torch.Generator().manual_seed(seed)
    words = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran"]
    rows = []
    for _ in range(n):
        length = int(torch.randint(2, 9, (1,), generator=g))
        text = " ".join(words[int(i)] for i in torch.randint(0, len(words), (length,), generator=g))
        rows.append({"text": text, "label": int(torch.randint(0, 3, (1,), generator=g))})
    return rows
