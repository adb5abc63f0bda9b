import torch.backends.cudnn as cudnn
import torch.optim
import torch.utils.data

from boxes import BoxLoss, TinyDetector, save_state
from shapes_data import ToyShapes

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
resume_from = None
epochs = 40
cudnn.benchmark = True


def main():
    global resume_from
    if resume_from is None:
        first = 0
        detector = TinyDetector(n_classes=5)
        bias_params = [p for n, p in detector.named_parameters() if p.requires_grad and n.endswith(".bias")]
        other_params = [p for n, p in detector.named_parameters() if p.requires_grad and not n.endswith(".bias")]
        opt = torch.optim.SGD([{"params": bias_params, "lr": 2e-3}, {"params": other_params}], lr=1e-3, momentum=0.9)
    else:
        resume_from = torch.load(resume_from)  # expect: TW301
        first = resume_from["epoch"] + 1
        detector = resume_from["detector"]
        opt = resume_from["opt"]
    detector = detector.to(device)
    box_loss = BoxLoss(detector.anchors).to(device)
    shapes = ToyShapes("train")
    loader = torch.utils.data.DataLoader(shapes, batch_size=16, shuffle=True, collate_fn=shapes.collate, num_workers=2)
    for epoch in range(first, epochs):
        one_epoch(loader, detector, box_loss, opt)
        save_state(epoch, detector, opt)


def one_epoch(loader, detector, box_loss, opt):
    detector.train()
    for images, targets, classes in loader:
        images = images.to(device)
        targets = [t.to(device) for t in targets]
        classes = [c.to(device) for c in classes]
        offsets, logits = detector(images)
        loss = box_loss(offsets, logits, targets, classes)
        opt.zero_grad()  # silent: TW105
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
