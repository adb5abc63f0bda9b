import torch
import torch.nn.functional as F


def train(model, device, train_loader, opt, log_every=50):
    model.train()
    for i, (images, labels) in enumerate(train_loader):
        images, labels = images.to(device), labels.to(device)
        opt.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
        if i % log_every == 0:
            print(f"batch {i}/{len(train_loader)} loss {loss.item():.4f}")


def test(model, device, test_loader):
    model.eval()
    loss_sum = 0
    hits = 0
    with torch.no_grad():
        for images, labels in test_loader:
            images, labels = images.to(device), labels.to(device)
            logits = model(images)  # silent: TW104
            loss_sum += F.cross_entropy(logits, labels, reduction="sum").item()  # silent: TW102
            hits += logits.argmax(dim=1).eq(labels).sum().item()
    loss_sum /= len(test_loader.dataset)
    print(f"test loss {loss_sum:.4f}, accuracy {100.0 * hits / len(test_loader.dataset):.1f}%")  # silent: TW101
