import torch


def one_epoch(det_train, det, grid_loss, opt, train_loader, val_loader, out_file):
    det_train.train()
    for images, boxes in train_loader:
        opt.zero_grad()
        outputs = det_train(images)
        loss = sum(grid_loss(level, out, boxes) for level, out in enumerate(outputs))
        loss.backward()
        opt.step()
    det_train.eval()
    val_total = 0.0
    for images, boxes in val_loader:
        with torch.no_grad():
            opt.zero_grad()
            outputs = det_train(images)  # silent: TW104
            val_total += sum(grid_loss(level, out, boxes) for level, out in enumerate(outputs)).item()
    torch.save(det.state_dict(), out_file)
    return val_total
