import torch

dev = "cuda" if torch.cuda.is_available() else "cpu"


def fit_epoch(net, batches, criterion, opt):
    net.train()
    loss_total, acc_total = 0, 0
    with torch.profiler.profile(on_trace_ready=torch.profiler.tensorboard_trace_handler("traces")):
        for images, targets in batches:
            images, targets = images.to(dev, non_blocking=True), targets.to(dev, non_blocking=True)
            with torch.autocast(device_type=dev, enabled=True):  # expect: TW109
                scores = net(images)
                loss = criterion(scores, targets)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_total += loss.item()  # silent: TW102
            guesses = scores.argmax(dim=1)
            acc_total += (guesses == targets).sum().item() / len(scores)
    return loss_total / len(batches), acc_total / len(batches)  # silent: TW101
