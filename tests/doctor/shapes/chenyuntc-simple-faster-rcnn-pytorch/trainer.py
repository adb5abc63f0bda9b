import torch
from torch import nn


class DetectorTrainer(nn.Module):
    def __init__(self, detector, box_loss):
        super().__init__()
        self.detector = detector
        self.box_loss = box_loss
        self.optimizer = detector.get_optimizer()

    def forward(self, images, targets):
        return self.box_loss(self.detector(images), targets)

    def train_step(self, images, targets):
        self.optimizer.zero_grad()  # silent: TW105
        loss = self.forward(images, targets)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def save(self, path):
        torch.save({"detector": self.detector.state_dict(), "optimizer": self.optimizer.state_dict()}, path)
        return path

    def load(self, path):
        stored = torch.load(path)  # expect: TW301
        self.detector.load_state_dict(stored["detector"])
        self.optimizer.load_state_dict(stored["optimizer"])
        return self
