import json

import torch
import torch.backends.cudnn as cudnn
import torch.utils.data

from captions import CaptionSet

saved_file = "best_captioner.pt"
vocab_file = "vocab.json"
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
cudnn.benchmark = True

saved = torch.load(saved_file)  # expect: TW301
captioner = saved["captioner"].to(device)
captioner.eval()
cnn = saved["cnn"].to(device)
cnn.eval()
with open(vocab_file) as fh:
    vocab = json.load(fh)


def evaluate(width):
    loader = torch.utils.data.DataLoader(CaptionSet("test"), batch_size=1, shuffle=True, num_workers=1)
    guesses = []
    for picture, captions in loader:
        picture = picture.to(device)
        feats = cnn(picture)  # expect: TW104
        feats = feats.view(1, -1, feats.size(-1)).expand(width, -1, -1)
        guesses.append(captioner.beam_search(feats, vocab, width))
    return guesses


if __name__ == "__main__":
    print(len(evaluate(3)))
