import torch
import torch.nn as nn
import torchvision
import torchvision.transforms as transforms

pixels, classes = 28 * 28, 10
train_set = torchvision.datasets.FashionMNIST("data", train=True, transform=transforms.ToTensor(), download=True)
test_set = torchvision.datasets.FashionMNIST("data", train=False, transform=transforms.ToTensor())
train_loader = torch.utils.data.DataLoader(dataset=train_set, batch_size=128, shuffle=True)
test_loader = torch.utils.data.DataLoader(dataset=test_set, batch_size=128, shuffle=False)

linear = nn.Linear(pixels, classes)
criterion = nn.CrossEntropyLoss()
sgd = torch.optim.SGD(linear.parameters(), lr=0.01)

for epoch in range(3):
    for images, labels in train_loader:
        loss = criterion(linear(images.reshape(-1, pixels)), labels)
        sgd.zero_grad()
        loss.backward()
        sgd.step()

with torch.no_grad():
    right, seen = 0, 0
    for images, labels in test_loader:
        scores = linear(images.reshape(-1, pixels))  # latent: TW103
        right += (scores.argmax(1) == labels).sum()
        seen += labels.size(0)
    print(f"test accuracy {100 * right / seen:.2f}%")
