import argparse
import os

import torch
import torch.nn as nn
import torchvision
import torchvision.transforms as T

parser = argparse.ArgumentParser()
parser.add_argument("--continue_run", action="store_true")
args = parser.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"

tfm = T.Compose([T.ToTensor()])
train_set = torchvision.datasets.CIFAR10("./cifar", train=True, download=True, transform=tfm)
test_set = torchvision.datasets.CIFAR10("./cifar", train=False, download=True, transform=tfm)
train_batches = torch.utils.data.DataLoader(train_set, batch_size=64, shuffle=True)
test_batches = torch.utils.data.DataLoader(test_set, batch_size=64)

classifier = nn.Sequential(nn.Conv2d(3, 32, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
classifier = classifier.to(device)
first_epoch = 0
if args.continue_run:
    assert os.path.isdir("saved"), "nothing saved yet"
    snapshot = torch.load("./saved/last.pt")  # expect: TW301
    classifier.load_state_dict(snapshot["model"])
    first_epoch = snapshot["epoch"] + 1

loss_fn = nn.CrossEntropyLoss()
sgd = torch.optim.SGD(classifier.parameters(), lr=0.05, momentum=0.9)


def train_epoch():
    classifier.train()
    summed = 0.0
    for step, (images, labels) in enumerate(train_batches):
        images, labels = images.to(device), labels.to(device)
        sgd.zero_grad()
        loss = loss_fn(classifier(images), labels)
        loss.backward()
        sgd.step()
        summed += loss.item()  # silent: TW102
        print(f"step {step} mean loss {summed / (step + 1):.3f}")


def test_epoch():
    classifier.eval()
    hits = seen = 0
    with torch.no_grad():
        for images, labels in test_batches:
            images, labels = images.to(device), labels.to(device)
            logits = classifier(images)  # silent: TW104
            hits += logits.argmax(1).eq(labels).sum().item()
            seen += labels.size(0)
    return hits / seen


for epoch in range(first_epoch, first_epoch + 20):
    train_epoch()
    print(epoch, test_epoch())
