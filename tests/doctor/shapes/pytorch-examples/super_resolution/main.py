from math import log10

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from data import low_high_pairs
from model import SubPixelNet

dev = "cuda" if torch.cuda.is_available() else "cpu"
train_pairs, test_pairs = low_high_pairs(scale=3)
train_dl = DataLoader(train_pairs, batch_size=16, shuffle=True, num_workers=2)
test_dl = DataLoader(test_pairs, batch_size=8, shuffle=False, num_workers=2)
upscaler = SubPixelNet(scale=3).to(dev)
mse = nn.MSELoss()
adam = torch.optim.Adam(upscaler.parameters(), lr=1e-3)


def train(epoch):
    total = 0
    for step, (low, high) in enumerate(train_dl, 1):
        low, high = low.to(dev), high.to(dev)
        adam.zero_grad()
        loss = mse(upscaler(low), high)
        total += loss.item()
        loss.backward()
        adam.step()
    print(f"epoch {epoch}: mean loss {total / len(train_dl):.4f}")


def test():
    psnr_sum = 0
    with torch.no_grad():
        for low, high in test_dl:
            low, high = low.to(dev), high.to(dev)
            guess = upscaler(low)  # latent: TW103
            psnr_sum += 10 * log10(1 / mse(guess, high).item())
    print(f"mean PSNR {psnr_sum / len(test_dl):.2f} dB")  # silent: TW101


for epoch in range(1, 11):
    train(epoch)
    test()
