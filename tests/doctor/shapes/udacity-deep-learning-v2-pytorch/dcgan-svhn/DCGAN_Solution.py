import pickle

import numpy as np
import torch
import torch.optim as optim

from gan_parts import Critic, Painter, house_numbers, ones_loss, zeros_loss

noise_dim = 64
critic = Critic(32)
painter = Painter(noise_dim, 32)
critic_opt = optim.Adam(critic.parameters(), 2e-4, [0.5, 0.999])
painter_opt = optim.Adam(painter.parameters(), 2e-4, [0.5, 0.999])
gallery = []
history = []
fixed_noise = torch.from_numpy(np.random.uniform(-1, 1, size=(9, noise_dim))).float()

for epoch in range(30):
    for k, (real, _) in enumerate(house_numbers):
        n = real.size(0)
        critic_opt.zero_grad()
        noise = torch.from_numpy(np.random.uniform(-1, 1, size=(n, noise_dim))).float()
        d_loss = ones_loss(critic(real)) + zeros_loss(critic(painter(noise).detach()))
        d_loss.backward()
        critic_opt.step()
        painter_opt.zero_grad()
        noise = torch.from_numpy(np.random.uniform(-1, 1, size=(n, noise_dim))).float()
        g_loss = ones_loss(critic(painter(noise)))
        g_loss.backward()
        painter_opt.step()
        if k % 200 == 0:
            history.append((d_loss.item(), g_loss.item()))  # silent: TW102
    painter.eval()
    pictures = painter(fixed_noise)  # expect: TW104
    gallery.append(pictures)  # expect: TW102
    painter.train()

with open("gallery.pkl", "wb") as fh:
    pickle.dump(gallery, fh)
