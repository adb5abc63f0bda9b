import torch


def train_one_epoch(model, loss_fn, loader, optimizer, device):
    model.train()
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = loss_fn(images, model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item()


@torch.no_grad()
def evaluate(loader, model, device):
    model.eval()
    right, seen = 0, 0
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            logits = model(images)  # silent: TW104
        right += (logits.argmax(1) == labels).sum().item()
        seen += labels.numel()
    return right / seen
