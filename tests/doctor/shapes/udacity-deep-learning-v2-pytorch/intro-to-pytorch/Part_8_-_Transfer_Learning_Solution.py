import torch
from torch import nn, optim
from torchvision import datasets, models, transforms

prep = transforms.Compose([transforms.Resize(240), transforms.CenterCrop(224), transforms.ToTensor()])
train_set = datasets.ImageFolder("birds/train", transform=prep)
test_set = datasets.ImageFolder("birds/test", transform=prep)
trainloader = torch.utils.data.DataLoader(train_set, batch_size=32, shuffle=True)
testloader = torch.utils.data.DataLoader(test_set, batch_size=32)

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
net = models.resnet50(weights=models.ResNet50_Weights.DEFAULT)
for w in net.parameters():
    w.requires_grad = False
net.fc = nn.Sequential(nn.Linear(2048, 128), nn.ReLU(), nn.Dropout(0.3), nn.Linear(128, 4), nn.LogSoftmax(dim=1))
criterion = nn.NLLLoss()
adam = optim.Adam(net.fc.parameters(), lr=0.002)  # silent: TW107
net.to(device)

step, running, report_every = 0, 0.0, 10
for epoch in range(2):
    for images, labels in trainloader:
        step += 1
        images, labels = images.to(device), labels.to(device)
        loss = criterion(net(images), labels)
        adam.zero_grad()
        loss.backward()
        adam.step()
        running += loss.item()
        if step % report_every == 0:
            held_loss, held_acc = 0.0, 0.0
            net.eval()
            with torch.no_grad():
                for images, labels in testloader:
                    images, labels = images.to(device), labels.to(device)
                    logp = net(images)  # silent: TW104
                    held_loss += criterion(logp, labels).item()
                    hits = logp.argmax(dim=1) == labels
                    held_acc += torch.mean(hits.float()).item()
            print(f"{epoch}: train {running / report_every:.3f} test {held_loss / len(testloader):.3f} "
                  f"acc {held_acc / len(testloader):.3f}")  # silent: TW101
            running = 0.0
            net.train()  # expect: TW108
