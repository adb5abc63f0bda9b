import argparse

import torch

from detector import make_det_net

cli = argparse.ArgumentParser()
cli.add_argument("--weights", default="det_net.pth")
opts = cli.parse_args()


def evaluate_net(det_net, samples):
    kept = []
    for k in range(len(samples)):
        image, _ = samples[k]
        scores = det_net(image.unsqueeze(0)).detach()  # expect: TW104
        kept.append(scores[0, :, 0, 0].cpu())
    return kept


if __name__ == "__main__":
    det_net = make_det_net()
    det_net.load_state_dict(torch.load(opts.weights))  # expect: TW301
    det_net.eval()
    held_out = [(torch.rand(3, 64, 64), 0) for _ in range(8)]
    print(len(evaluate_net(det_net, held_out)))
