import torch


def run_epoch(net_train, net, opt, train_loader, val_loader, pixel_loss, out_file):
    net_train.train()
    for images, masks in train_loader:
        opt.zero_grad()
        loss = pixel_loss(net_train(images), masks)
        loss.backward()
        opt.step()
    net_train.eval()
    val_sum = 0.0
    for images, masks in val_loader:
        with torch.no_grad():
            val_sum += pixel_loss(net_train(images), masks).item()
    torch.save(net.state_dict(), out_file)
    return val_sum / max(len(val_loader), 1)
