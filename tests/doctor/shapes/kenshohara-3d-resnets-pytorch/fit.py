from helpers import RunningMean


def fit_one_epoch(net, feed, loss_fn, opt):
    net.train()
    seen = RunningMean()
    for clips, labels in feed:
        out = net(clips)
        loss = loss_fn(out, labels)
        seen.add(loss.item(), clips.size(0))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return seen.total / max(seen.count, 1)
