# Public-code corpus case (trainwise doctor, issue 30): labmlai-annotated-deep-learning-paper-implementations/labml_nn/scaling/zero3/__init__.py
# Source: https://github.com/labmlai/annotated_deep_learning_paper_implementations/blob/e6b3c8a6a2cdae4071bcde1abeaaf9a2bc37bd53/labml_nn/scaling/zero3/__init__.py
# Repository: labmlai/annotated_deep_learning_paper_implementations at commit e6b3c8a6a2cdae4071bcde1abeaaf9a2bc37bd53
# Path: labml_nn/scaling/zero3/__init__.py
# Licence: MIT (copyright its authors); a verbatim excerpt for testing: only the lines named
# below are kept, unchanged but for the markers at line ends.
# Markers: `# expect: TWxxx` a real bug that must be reported; `# silent: TWxxx` a look-alike that
# must not be reported; `# latent: TWxxx` the pattern is there but has no effect in this program.

# --- lines 32-37 ---
import functools
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn
# --- lines 40-40 ---
class Zero3Layer(nn.Module):
# --- lines 81-81 ---
    def __init__(self, module: nn.Module, rank: int, world_size: int, device: torch.device, dtype: torch.dtype):
# --- lines 89-89 ---
        super().__init__()
# --- lines 91-92 ---
        # Initialize the properties
        self.device = device
# --- lines 103-104 ---
        with torch.no_grad():
            # Collect all the parameters of the layer
# --- lines 137-139 ---
            # parameters to be stored in current device/node
            self.chunk = [nn.Parameter(self._empty((s,)), requires_grad=i == self.TRAINING_PARAMS_IDX)  # silent: TW114
                          for i, s in enumerate(self.chunk_size)]
# --- lines 186-197 ---
    def get_trainable_chunk(self) -> List[nn.Parameter]:
        """
        ### Get trainable chunk/shard of the parameters.

        This is what we pass on to the optimizer on the current node.
        """
        # Return and empty list if there are no trainable parameters
        if len(self.chunk[self.TRAINING_PARAMS_IDX]) == 0:
            return []

        # Return the trainable chunk as a list
        return [self.chunk[self.TRAINING_PARAMS_IDX]]
