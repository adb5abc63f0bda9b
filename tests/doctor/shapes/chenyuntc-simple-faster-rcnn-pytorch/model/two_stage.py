import torch
from torch import nn


def without_grad(method):
    def wrapped(*args, **kwargs):
        with torch.no_grad():
            return method(*args, **kwargs)
    return wrapped


class TwoStageDetector(nn.Module):
    def __init__(self, trunk, head, lr=1e-3):
        super().__init__()
        self.trunk, self.head, self.lr = trunk, head, lr

    def forward(self, x):
        return self.head(self.trunk(x).flatten(1))

    @without_grad
    def predict(self, images):
        self.eval()
        boxes, scores = [], []
        for image in images:
            out = self(image[None].float())
            scores.append(out.softmax(dim=1).amax(dim=1))
            boxes.append(out[:, :4])
        self.train()  # silent: TW108
        return boxes, scores

    def get_optimizer(self):
        trainable = [p for p in self.parameters() if p.requires_grad]
        self.optimizer = torch.optim.SGD(trainable, lr=self.lr, momentum=0.9)
        return self.optimizer
