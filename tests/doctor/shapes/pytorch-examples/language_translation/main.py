import torch

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def causal_masks(src, tgt_in, pad_id):
    size = tgt_in.shape[0]
    tgt_mask = torch.triu(torch.full((size, size), float("-inf"), device=DEV), diagonal=1)
    return tgt_mask, (src == pad_id).T, (tgt_in == pad_id).T


def train(seq2seq, pairs, criterion, opt, pad_id, quick=False):
    running = 0
    seq2seq.train()
    for src, tgt in pairs:
        src, tgt = src.to(DEV), tgt.to(DEV)
        tgt_in = tgt[:-1, :]
        tgt_mask, src_pad, tgt_pad = causal_masks(src, tgt_in, pad_id)
        scores = seq2seq(src, tgt_in, tgt_mask, src_pad, tgt_pad)
        opt.zero_grad()
        loss = criterion(scores.reshape(-1, scores.shape[-1]), tgt[1:, :].reshape(-1))
        loss.backward()
        opt.step()
        running += loss.item()  # silent: TW102
        if quick:
            break
    return running / len(list(pairs))  # silent: TW101


def validate(seq2seq, pairs, criterion, pad_id):
    running = 0
    seq2seq.eval()
    for src, tgt in pairs:
        src, tgt = src.to(DEV), tgt.to(DEV)
        tgt_in = tgt[:-1, :]
        tgt_mask, src_pad, tgt_pad = causal_masks(src, tgt_in, pad_id)
        scores = seq2seq(src, tgt_in, tgt_mask, src_pad, tgt_pad)  # expect: TW104
        loss = criterion(scores.reshape(-1, scores.shape[-1]), tgt[1:, :].reshape(-1))
        running += loss.item()
    return running / len(list(pairs))
