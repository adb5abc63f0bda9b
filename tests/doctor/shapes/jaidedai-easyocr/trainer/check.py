import torch


def validation(model, loss_fn, loader, codec, cfg, device):
    right, seen, loss_sum = 0, 0, 0.0
    for images, texts in loader:
        n = images.size(0)
        images = images.to(device)
        blank_prompt = torch.zeros(n, cfg.max_len + 1, dtype=torch.long, device=device)
        target, target_len = codec.encode(texts, max_len=cfg.max_len)
        preds = model(images, blank_prompt)  # silent: TW103  # silent: TW104
        pred_len = torch.full((n,), preds.size(1), dtype=torch.int32)
        loss_sum += loss_fn(preds.log_softmax(2).permute(1, 0, 2), target, pred_len, target_len).item()
        decoded = codec.decode(preds.argmax(2).flatten(), pred_len)
        right += sum(int(a == b) for a, b in zip(decoded, texts))
        seen += n
    return loss_sum / max(len(loader), 1), right / max(seen, 1)
