import torch
import torch.nn as nn


class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(8, 32)
        self.down = nn.Linear(32, 4)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


dev = "cuda" if torch.cuda.is_available() else "cpu"
split_model = TwoLayer().to(dev)
adam = torch.optim.AdamW(split_model.parameters(), lr=0.1, foreach=True)

for it in range(12):
    torch.manual_seed(it)
    x = torch.rand(16, 8, device=dev)
    split_model(x).sum().backward()
    adam.step()  # expect: TW105
    print(f"iteration {it} done")
