# Public-code corpus case (trainwise doctor, issue 30): allegro-allrank/allrank/models/model.py
# Source: https://github.com/allegro/allRank/blob/c88475661cb72db292d13283fdbc4f2ae6498ee4/allrank/models/model.py
# Repository: allegro/allRank at commit c88475661cb72db292d13283fdbc4f2ae6498ee4
# Path: allrank/models/model.py
# Licence: Apache-2.0 (copyright its authors); a verbatim excerpt for testing: only the lines named
# below are kept, unchanged but for the markers at line ends.
# Markers: `# expect: TWxxx` a real bug that must be reported; `# silent: TWxxx` a look-alike that
# must not be reported; `# latent: TWxxx` the pattern is there but has no effect in this program.

# --- lines 1-1 ---
import torch.nn as nn
# --- lines 12-12 ---
class FCModel(nn.Module):
# --- lines 16-16 ---
    def __init__(self, sizes, input_norm, activation, dropout, n_features):
# --- lines 24-26 ---
        super(FCModel, self).__init__()
        sizes.insert(0, n_features)
        layers = [nn.Linear(size_in, size_out) for size_in, size_out in zip(sizes[:-1], sizes[1:])]
# --- lines 33-33 ---
        self.layers = nn.ModuleList(layers)  # silent: TW114
