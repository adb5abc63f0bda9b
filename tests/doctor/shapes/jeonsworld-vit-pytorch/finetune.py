import numpy as np
import torch


def valid(cfg, model, test_loader):
    model.eval()
    guesses, truths = [], []
    loss_fn = torch.nn.CrossEntropyLoss()
    for images, labels in test_loader:
        images, labels = images.to(cfg.device), labels.to(cfg.device)
        with torch.no_grad():
            logits = model(images)[0]  # silent: TW104
            loss_fn(logits, labels)
        guesses.append(logits.argmax(-1).cpu().numpy())
        truths.append(labels.cpu().numpy())
    return float((np.concatenate(guesses) == np.concatenate(truths)).mean())


def train(cfg, model, train_loader, test_loader):
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    model.zero_grad()
    step_count, best = 0, 0.0
    while step_count < cfg.total_steps:
        model.train()
        for k, (images, labels) in enumerate(train_loader):
            loss = model(images.to(cfg.device), labels.to(cfg.device))
            if cfg.accumulate > 1:
                loss = loss / cfg.accumulate  # silent: TW106
            loss.backward()
            if (k + 1) % cfg.accumulate == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()
                step_count += 1
                if step_count % cfg.eval_every == 0:
                    best = max(best, valid(cfg, model, test_loader))
                    model.train()  # silent: TW103
                if step_count >= cfg.total_steps:
                    break
    return best
