import torch
import torch.nn as nn

device = "cuda" if torch.cuda.is_available() else "cpu"


def one_pass(model, batches, opt=None, criterion=nn.CrossEntropyLoss(), lr=1e-3):
    opt = opt or torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    loss_sum, right, n = 0, 0, 0
    for xb, yb in batches:
        yb = yb.to(device)
        opt.zero_grad()
        scores = model(xb.to(device))
        loss = criterion(scores, yb)
        loss.backward()
        opt.step()
        loss_sum += loss  # expect: TW102
        right += (scores.argmax(1) == yb).sum()
        n += len(yb)
    return loss_sum.item() / n, right.item() / n


def check(model, batches, criterion=nn.CrossEntropyLoss()):
    model.eval()
    loss_sum, right, n = 0, 0, 0
    with torch.no_grad():
        for xb, yb in batches:
            yb = yb.to(device)
            scores = model(xb.to(device))
            loss_sum += criterion(scores, yb)  # silent: TW102
            right += (scores.argmax(1) == yb).sum()
            n += len(yb)
    return loss_sum.item() / n, right.item() / n


def many_passes(model, train_batches, test_batches, rounds=3, opt=None, criterion=nn.CrossEntropyLoss(), every=20):
    opt = opt or torch.optim.SGD(model.parameters(), lr=1e-3)
    for rnd in range(rounds):
        model.train()
        loss_sum, right, n = 0, 0, 0
        for k, (xb, yb) in enumerate(train_batches):
            yb = yb.to(device)
            opt.zero_grad()
            scores = model(xb.to(device))
            loss = criterion(scores, yb)
            loss.backward()
            opt.step()
            loss_sum += loss  # expect: TW102
            right += (scores.argmax(1) == yb).sum()
            n += len(yb)
            if k % every == 0:
                print(f"round {rnd} batch {k}: acc {right.item() / n:.3f} loss {loss_sum.item() / n:.4f}")
        print(rnd, check(model, test_batches, criterion))
