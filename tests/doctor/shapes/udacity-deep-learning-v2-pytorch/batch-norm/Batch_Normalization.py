import torch
import torchvision.transforms as transforms
from torch import nn
from torchvision import datasets

from nets import SmallMLP

digits = datasets.MNIST("data", train=False, download=True, transform=transforms.ToTensor())
test_loader = torch.utils.data.DataLoader(digits, batch_size=100, num_workers=0)
with_norm = SmallMLP(batch_norm=True)
without_norm = SmallMLP(batch_norm=False)


def test(model, in_train_mode):
    per_class_hits = [0.0] * 10
    per_class_seen = [0.0] * 10
    loss_sum = 0.0
    if in_train_mode:
        model.train()
    else:
        model.eval()
    criterion = nn.CrossEntropyLoss()
    for images, labels in test_loader:
        out = model(images)  # expect: TW104
        loss_sum += criterion(out, labels).item() * images.size(0)
        hits = out.argmax(1).eq(labels)
        for k in range(images.size(0)):
            per_class_hits[labels[k]] += hits[k].item()
            per_class_seen[labels[k]] += 1
    print(f"test loss {loss_sum / len(test_loader.dataset):.4f}")
    print(f"accuracy {100.0 * sum(per_class_hits) / sum(per_class_seen):.1f}%")


test(with_norm, in_train_mode=True)
test(with_norm, in_train_mode=False)
test(without_norm, in_train_mode=False)
