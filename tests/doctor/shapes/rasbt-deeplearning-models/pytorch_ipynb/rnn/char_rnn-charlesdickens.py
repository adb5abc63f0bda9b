import random
import string

import torch
import torch.nn.functional as F

torch.manual_seed(3)
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
WINDOW = 120
corpus = open("poems.txt").read()


def encode(text):
    return torch.tensor([string.printable.index(ch) for ch in text], dtype=torch.long)


class CharGRU(torch.nn.Module):
    def __init__(self, vocab, width):
        super().__init__()
        self.width = width
        self.embed = torch.nn.Embedding(vocab, width)
        self.gru = torch.nn.GRU(width, width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, char, state):
        out, state = self.gru(self.embed(char.view(1, -1)).view(1, 1, -1), state)
        return self.head(out.view(1, -1)), state

    def zero_state(self):
        return torch.zeros(1, 1, self.width, device=DEVICE)


net = CharGRU(len(string.printable), 64).to(DEVICE)
adam = torch.optim.Adam(net.parameters(), lr=0.004)


def evaluate(net, start="Th", length=80, temperature=0.7):
    state = net.zero_state()
    seed_chars = encode(start)
    text = start
    for k in range(len(start) - 1):
        _, state = net(seed_chars[k].to(DEVICE), state)  # latent: TW103  # silent: TW104
    char = seed_chars[-1]
    for _ in range(length):
        out, state = net(char.to(DEVICE), state)
        pick = torch.multinomial(out.data.view(-1).div(temperature).exp(), 1)[0]
        text += string.printable[pick]
        char = encode(string.printable[pick])
    return text


for it in range(5000):
    state = net.zero_state()
    adam.zero_grad()
    loss = 0.0
    start = random.randint(0, len(corpus) - WINDOW - 2)
    chunk = encode(corpus[start:start + WINDOW + 1]).to(DEVICE)
    for c in range(WINDOW):
        out, state = net(chunk[c], state)
        loss += F.cross_entropy(out, chunk[c + 1].view(1))  # silent: TW102
    loss /= WINDOW
    loss.backward()
    adam.step()
    with torch.set_grad_enabled(False):
        if it % 500 == 0:
            print(it, loss.item(), evaluate(net, "Th", 100))
