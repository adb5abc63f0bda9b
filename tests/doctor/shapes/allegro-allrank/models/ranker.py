import torch.nn as nn


class ListScorer(nn.Module):
    def __init__(self, hidden_widths, n_inputs):
        super().__init__()
        widths = [n_inputs, *hidden_widths]
        stack = [nn.Linear(w_in, w_out) for w_in, w_out in zip(widths[:-1], widths[1:])]
        self.stack = nn.ModuleList(stack)  # silent: TW114
        self.act = nn.ReLU()

    def forward(self, x):
        for layer in self.stack:
            x = self.act(layer(x))
        return x
