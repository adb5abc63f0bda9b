import torch
from torch import nn, optim

from fashion import FashionNet, testloader, trainloader

net = FashionNet()
criterion = nn.NLLLoss()
adam = optim.Adam(net.parameters(), lr=0.002)
train_curve, test_curve = [], []
for epoch in range(15):
    running = 0
    for images, labels in trainloader:
        adam.zero_grad()
        loss = criterion(net(images), labels)
        loss.backward()
        adam.step()
        running += loss.item()
    else:
        held_loss = 0
        held_acc = 0
        with torch.no_grad():
            net.eval()
            for images, labels in testloader:
                logp = net(images)
                held_loss += criterion(logp, labels)  # silent: TW102
                hits = logp.argmax(dim=1) == labels
                held_acc += torch.mean(hits.float())
        net.train()
        train_curve.append(running / len(trainloader))
        test_curve.append(held_loss / len(testloader))
        print(epoch, train_curve[-1], test_curve[-1], held_acc / len(testloader))  # silent: TW101
