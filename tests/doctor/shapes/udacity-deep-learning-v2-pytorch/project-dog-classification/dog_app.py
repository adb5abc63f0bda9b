import numpy as np
import torch
import torch.nn as nn


class ScratchNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.head = nn.Linear(8, 120)

    def forward(self, x):
        return self.head(self.conv(x).mean(dim=(2, 3)))


on_gpu = torch.cuda.is_available()
scratch = ScratchNet()
if on_gpu:
    scratch.cuda()


def test(loaders, model, criterion, on_gpu):
    mean_loss, right, seen = 0.0, 0.0, 0.0
    model.eval()
    for k, (images, labels) in enumerate(loaders["test"]):
        if on_gpu:
            images, labels = images.cuda(), labels.cuda()
        out = model(images)  # expect: TW104
        loss = criterion(out, labels)
        mean_loss = mean_loss + (loss.data - mean_loss) / (k + 1)
        pred = out.data.max(1, keepdim=True)[1]
        right += np.sum(pred.eq(labels.data.view_as(pred)).cpu().numpy())
        seen += images.size(0)
    print(f"test loss {mean_loss:.4f}, accuracy {100.0 * right / seen:.1f}%")


test(breed_loaders, scratch, nn.CrossEntropyLoss(), on_gpu)
