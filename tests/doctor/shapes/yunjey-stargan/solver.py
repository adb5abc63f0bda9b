import os

import torch
from torchvision.utils import save_image

from model import Critic, Translator


class Runner:
    def __init__(self, loader, cfg):
        self.loader = loader
        self.cfg = cfg
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.T = Translator(cfg.width, cfg.n_domains)
        self.C = Critic(cfg.size, cfg.width, cfg.n_domains)
        self.t_opt = torch.optim.Adam(self.T.parameters(), cfg.lr, [0.5, 0.999])
        self.c_opt = torch.optim.Adam(self.C.parameters(), cfg.lr, [0.5, 0.999])
        self.T.to(self.device)
        self.C.to(self.device)

    def restore(self, step):
        t_file = os.path.join(self.cfg.save_dir, f"{step}-T.pt")
        c_file = os.path.join(self.cfg.save_dir, f"{step}-C.pt")
        self.T.load_state_dict(torch.load(t_file, map_location="cpu"))  # expect: TW301
        self.C.load_state_dict(torch.load(c_file, map_location="cpu"))  # expect: TW301

    def clear_grads(self):
        self.t_opt.zero_grad()
        self.c_opt.zero_grad()

    def domain_targets(self, labels):
        return [torch.roll(labels, k, dims=1).to(self.device) for k in range(1, self.cfg.n_domains)]

    def train(self):
        batches = iter(self.loader)
        if self.cfg.resume:
            self.restore(self.cfg.resume)
        for step in range(self.cfg.resume or 0, self.cfg.steps):
            try:
                real, src = next(batches)
            except StopIteration:
                batches = iter(self.loader)
                real, src = next(batches)
            real, src = real.to(self.device), src.to(self.device)
            dst = src[torch.randperm(src.size(0))]
            fake = self.T(real, dst)
            c_loss = self.C(fake.detach()).mean() - self.C(real).mean()
            self.clear_grads()  # silent: TW105
            c_loss.backward()
            self.c_opt.step()
            if (step + 1) % self.cfg.critic_steps == 0:
                cycle = self.T(self.T(real, dst), src)
                t_loss = -self.C(self.T(real, dst)).mean() + 10 * torch.mean(torch.abs(real - cycle))
                self.clear_grads()
                t_loss.backward()
                self.t_opt.step()
            if (step + 1) % self.cfg.save_every == 0:
                torch.save(self.T.state_dict(), os.path.join(self.cfg.save_dir, f"{step + 1}-T.pt"))
                torch.save(self.C.state_dict(), os.path.join(self.cfg.save_dir, f"{step + 1}-C.pt"))

    def test(self):
        self.restore(self.cfg.test_step)
        with torch.no_grad():
            for k, (real, src) in enumerate(self.loader):
                real = real.to(self.device)
                row = [real]
                for dst in self.domain_targets(src):
                    row.append(self.T(real, dst))  # latent: TW103
                grid = torch.cat(row, dim=3)
                save_image((grid.cpu() + 1) / 2, os.path.join(self.cfg.out_dir, f"{k + 1}.png"), nrow=1)
