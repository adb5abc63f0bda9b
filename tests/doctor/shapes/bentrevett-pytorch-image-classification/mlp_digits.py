import torch


def hit_rate(logits, labels):
    return (logits.argmax(1) == labels).float().mean()


def fit_epoch(net, batches, opt, loss_fn, device):
    total_loss, total_hits = 0.0, 0.0
    net.train()
    for images, labels in batches:
        images, labels = images.to(device), labels.to(device)
        opt.zero_grad()
        logits = net(images)
        loss = loss_fn(logits, labels)
        hits = hit_rate(logits, labels)
        loss.backward()
        opt.step()
        total_loss += loss.item()
        total_hits += hits.item()
    return total_loss / len(batches), total_hits / len(batches)  # silent: TW101


def score_epoch(net, batches, loss_fn, device):
    total_loss, total_hits = 0.0, 0.0
    net.eval()
    with torch.no_grad():
        for images, labels in batches:
            images, labels = images.to(device), labels.to(device)
            logits = net(images)
            total_loss += loss_fn(logits, labels).item()
            total_hits += hit_rate(logits, labels).item()
    return total_loss / len(batches), total_hits / len(batches)  # silent: TW101
