import torch
import torch.utils.data

from boxes import mean_average_precision
from shapes_data import ToyShapes

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
saved = torch.load("detector_last.pt")  # expect: TW301
detector = saved["detector"].to(device)
detector.eval()
shapes = ToyShapes("test")
test_loader = torch.utils.data.DataLoader(shapes, batch_size=32, shuffle=False, collate_fn=shapes.collate)


def evaluate(test_loader, detector):
    detector.eval()
    found, truth = [], []
    with torch.no_grad():
        for images, targets, classes in test_loader:
            offsets, logits = detector(images.to(device))  # silent: TW104
            found.extend(detector.decode(offsets, logits, min_score=0.05))
            truth.extend(zip(targets, classes))
    print(f"mAP {mean_average_precision(found, truth):.3f}")


if __name__ == "__main__":
    evaluate(test_loader, detector)
