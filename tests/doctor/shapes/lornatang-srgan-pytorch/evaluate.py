import torch


def evaluate(gen, pairs, psnr_fn):
    gen.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for low, high in pairs:
            total += psnr_fn(gen(low), high).item()
            count += 1
    return total / max(count, 1)
