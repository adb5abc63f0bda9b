import torch
from PIL import Image
from torchvision import transforms

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
saved = torch.load("detector_last.pt")  # expect: TW301
detector = saved["detector"].to(device)
detector.eval()
prep = transforms.Compose([transforms.Resize((256, 256)), transforms.ToTensor()])


def detect(picture, min_score=0.3):
    x = prep(picture).to(device)
    offsets, logits = detector(x.unsqueeze(0))  # latent: TW104
    found = detector.decode(offsets, logits, min_score=min_score)
    return [box.tolist() for box in found[0]]


if __name__ == "__main__":
    print(detect(Image.open("example.png").convert("RGB")))
