import torch
from torch.utils.data import DataLoader

from nets import SmallConv
from helper_evaluate import mean_loss

device = "cuda" if torch.cuda.is_available() else "cpu"
train_dl = DataLoader(torch.load("train_tensors.pt", weights_only=True), batch_size=128, shuffle=True)
val_dl = DataLoader(torch.load("val_tensors.pt", weights_only=True), batch_size=256)
torch.manual_seed(5)
net = SmallConv(10).to(device)
criterion = torch.nn.CrossEntropyLoss()
sgd = torch.optim.SGD(net.parameters(), lr=1e-4)
trace = {"lr": [], "loss": [], "val": []}
lr = 1e-4

for epoch in range(6):
    for images, labels in train_dl:
        images, labels = images.to(device), labels.to(device)
        loss = criterion(net(images), labels)
        sgd.zero_grad()
        loss.backward()
        sgd.step()
        net = net.eval()
        trace["lr"].append(lr)
        trace["val"].append(mean_loss(net, val_dl, device))
        trace["loss"].append(loss)  # expect: TW102
        net = net.train()
        lr *= 1.1
        for group in sgd.param_groups:
            group["lr"] = lr

for epoch in range(6):
    running = 0.0
    net = net.train()
    for images, labels in train_dl:
        images, labels = images.to(device), labels.to(device)
        loss = criterion(net(images), labels)
        sgd.zero_grad()
        loss.backward()
        sgd.step()
        running += loss  # expect: TW102
    print(epoch, running / len(train_dl))
