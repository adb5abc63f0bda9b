# Public-code corpus case (trainwise doctor, issue 15): bentrevett-pytorch-sentiment-analysis/1_-_Neural_Bag_of_Words.py
# Source: https://github.com/bentrevett/pytorch-sentiment-analysis/blob/329f654b2cfaed22fee432569ebd7a2674584f79/1%20-%20Neural%20Bag%20of%20Words.ipynb
# Repository: bentrevett/pytorch-sentiment-analysis at commit 329f654b2cfaed22fee432569ebd7a2674584f79
# Path: 1 - Neural Bag of Words.ipynb
# Licence: MIT (copyright its authors); a verbatim excerpt for testing: only the lines named
# below are kept, unchanged but for IPython magics (replaced by `pass`) and the markers at line ends.
# Markers: `# expect: TWxxx` a real bug that must be reported; `# silent: TWxxx` a look-alike that
# must not be reported; `# latent: TWxxx` the pattern is there but has no effect in this program.

# --- notebook cell 5, lines 6-9 ---
import torch
import torch.nn as nn
import torch.optim as optim
import torchtext
# --- notebook cell 76, lines 5-5 ---
model = NBoW(vocab_size, embedding_dim, output_dim, pad_index)
# --- notebook cell 98, lines 1-3 ---
model.load_state_dict(torch.load("nbow.pt"))  # expect: TW301

test_loss, test_acc = evaluate(test_data_loader, model, criterion, device)
