import torch
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets
from torchvision.transforms import ToTensor

from metrics import percent_correct

digits_train = datasets.KMNIST("data", train=True, download=True, transform=ToTensor())
digits_test = datasets.KMNIST("data", train=False, download=True, transform=ToTensor())
train_dl = DataLoader(digits_train, batch_size=64, shuffle=True)
test_dl = DataLoader(digits_test, batch_size=64, shuffle=False)


class TinyMLP(nn.Module):
    def __init__(self, n_in: int, n_hidden: int, n_out: int):
        super().__init__()
        self.stack = nn.Sequential(nn.Flatten(), nn.Linear(n_in, n_hidden), nn.Linear(n_hidden, n_out))

    def forward(self, x):
        return self.stack(x)


mlp = TinyMLP(28 * 28, 16, 10)
criterion = nn.CrossEntropyLoss()
sgd = torch.optim.SGD(params=mlp.parameters(), lr=0.05)

for epoch in range(2):
    epoch_loss = 0
    for step, (images, targets) in enumerate(train_dl):
        mlp.train()
        logits = mlp(images)
        loss = criterion(logits, targets)
        epoch_loss += loss  # expect: TW102
        sgd.zero_grad()
        loss.backward()
        sgd.step()
    epoch_loss /= len(train_dl)

    eval_loss, eval_acc = 0, 0
    mlp.eval()
    with torch.inference_mode():
        for images, targets in test_dl:
            logits = mlp(images)
            eval_loss += criterion(logits, targets)  # silent: TW102
            eval_acc += percent_correct(targets, logits.argmax(dim=1))
        eval_loss /= len(test_dl)
        eval_acc /= len(test_dl)  # silent: TW101
    print(f"epoch {epoch}: train {epoch_loss:.4f} test {eval_loss:.4f} acc {eval_acc:.1f}%")
