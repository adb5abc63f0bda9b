# Public-code corpus case (trainwise doctor, issue 30): mrdbourke-pytorch-deep-learning/00_pytorch_fundamentals.py
# Source: https://github.com/mrdbourke/pytorch-deep-learning/blob/baa27b691617461c173ecf3439793cd8cde74e13/00_pytorch_fundamentals.ipynb
# Repository: mrdbourke/pytorch-deep-learning at commit baa27b691617461c173ecf3439793cd8cde74e13
# Path: 00_pytorch_fundamentals.ipynb
# Licence: MIT (copyright its authors); a verbatim excerpt for testing: only the lines named
# below are kept, unchanged but for IPython magics (replaced by `pass`) and the markers at line ends.
# Markers: `# expect: TWxxx` a real bug that must be reported; `# silent: TWxxx` a look-alike that
# must not be reported; `# latent: TWxxx` the pattern is there but has no effect in this program.

# --- notebook cell 130, lines 1-6 ---
# NumPy array to tensor
import torch
import numpy as np
array = np.arange(1.0, 8.0)
tensor = torch.from_numpy(array)  # silent: TW116
array, tensor
# --- notebook cell 132, lines 1-3 ---
# Change the array, keep the tensor
array = array + 1
array, tensor
# --- notebook cell 134, lines 1-4 ---
# Tensor to NumPy array
tensor = torch.ones(7) # create a tensor of ones with dtype=float32
numpy_tensor = tensor.numpy() # will be dtype=float32 unless changed  # silent: TW116
tensor, numpy_tensor
# --- notebook cell 136, lines 1-3 ---
# Change the tensor, keep the array the same
tensor = tensor + 1
tensor, numpy_tensor
