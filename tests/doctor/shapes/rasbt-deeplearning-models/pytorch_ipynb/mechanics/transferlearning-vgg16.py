import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torchvision import datasets, models, transforms

if torch.cuda.is_available():
    torch.backends.cudnn.deterministic = True
seed = 7
epochs = 4
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

prep = transforms.Compose([transforms.Resize((224, 224)), transforms.ToTensor()])
flowers_train = datasets.Flowers102("data", split="train", transform=prep, download=True)
train_dl = DataLoader(dataset=flowers_train, batch_size=64, num_workers=6, shuffle=True)  # expect: TW201

net = models.vgg11(weights=models.VGG11_Weights.DEFAULT)
for p in net.parameters():
    p.requires_grad = False
net.classifier[0].requires_grad = True  # expect: TW110
net.classifier[6] = nn.Sequential(nn.Linear(4096, 256), nn.ReLU(), nn.Linear(256, 102))
net = net.to(DEVICE)
adam = torch.optim.Adam(net.parameters())  # latent: TW107


def accuracy(net, batches):
    net.eval()
    right, seen = 0, 0
    for images, labels in batches:
        images, labels = images.to(DEVICE), labels.to(DEVICE)
        logits = net(images)  # silent: TW104
        right += (logits.argmax(1) == labels).sum()
        seen += labels.size(0)
    return right.float() / seen * 100


for epoch in range(epochs):
    net.train()
    for images, labels in train_dl:
        images, labels = images.to(DEVICE), labels.to(DEVICE)
        loss = F.cross_entropy(net(images), labels)
        adam.zero_grad()
        loss.backward()
        adam.step()
    net.eval()
    with torch.set_grad_enabled(False):
        print(f"epoch {epoch}: train accuracy {accuracy(net, train_dl):.2f}%")
