from collections import namedtuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Categorical

Step = namedtuple("Step", ["log_prob", "value"])


class ActorCritic(nn.Module):
    def __init__(self, n_obs=4, n_act=2):
        super().__init__()
        self.body = nn.Linear(n_obs, 64)
        self.actor = nn.Linear(64, n_act)
        self.critic = nn.Linear(64, 1)
        self.steps, self.rewards = [], []

    def forward(self, obs):
        h = F.relu(self.body(obs))
        return F.softmax(self.actor(h), dim=-1), self.critic(h)


agent = ActorCritic()
adam = torch.optim.Adam(agent.parameters(), lr=1e-2)
tiny = np.finfo(np.float32).eps.item()
discount = 0.97


def act(obs):
    probs, value = agent(torch.from_numpy(obs).float())
    dist = Categorical(probs)
    choice = dist.sample()
    agent.steps.append(Step(dist.log_prob(choice), value))  # silent: TW102
    return choice.item()


def end_episode():
    ret, returns = 0.0, []
    for r in reversed(agent.rewards):
        ret = r + discount * ret
        returns.insert(0, ret)
    returns = torch.tensor(returns)
    returns = (returns - returns.mean()) / (returns.std() + tiny)
    actor_terms, critic_terms = [], []
    for (log_prob, value), target in zip(agent.steps, returns):
        advantage = target - value.item()
        actor_terms.append(-log_prob * advantage)  # silent: TW102
        critic_terms.append(F.smooth_l1_loss(value, torch.tensor([target])))  # silent: TW102
    adam.zero_grad()
    loss = torch.stack(actor_terms).sum() + torch.stack(critic_terms).sum()
    loss.backward()
    adam.step()
    del agent.rewards[:]
    del agent.steps[:]
