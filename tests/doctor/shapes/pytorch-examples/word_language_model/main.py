import argparse

import torch
import torch.onnx

from model import RecurrentLM

parser = argparse.ArgumentParser()
parser.add_argument("--onnx_file", default="")
parser.add_argument("--seq_len", type=int, default=35)
opts = parser.parse_args()
device = torch.device("cpu")
lm = RecurrentLM(vocab=5000, width=128).to(device)


def to_onnx(target, batch, length):
    lm.eval()
    tokens = torch.zeros(length, batch, dtype=torch.long, device=device)
    state = lm.init_hidden(batch)
    torch.onnx.export(lm, (tokens, state), target)  # silent: TW117


if opts.onnx_file:
    to_onnx(opts.onnx_file, batch=1, length=opts.seq_len)
