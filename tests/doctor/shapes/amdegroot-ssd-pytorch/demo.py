import argparse

import torch

from detector import make_det_net

cli = argparse.ArgumentParser()
cli.add_argument("--weights", default="det_net.pth")
opts = cli.parse_args()


def test_network(det_net, samples, report_file):
    for k in range(len(samples)):
        image, truth = samples[k]
        with open(report_file, "a") as out:
            out.write(f"sample {k}: {truth}\n")
        pred = det_net(image.unsqueeze(0))  # expect: TW104
        best = pred.data[0].amax(dim=0)
        with open(report_file, "a") as out:
            out.write(f"best {best.max().item():.3f}\n")


def main(samples):
    det_net = make_det_net()
    det_net.load_state_dict(torch.load(opts.weights))  # expect: TW301
    det_net.eval()
    test_network(det_net, samples, "boxes.txt")


if __name__ == "__main__":
    main([])
