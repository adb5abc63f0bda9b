import numpy as np
import torch

grid = np.linspace(0.0, 1.0, 5)
as_tensor = torch.from_numpy(grid)  # silent: TW116
print(grid, as_tensor)

grid = grid * 10
print(grid, as_tensor)

weights = torch.zeros(4)
weights_np = weights.numpy()  # silent: TW116
print(weights, weights_np)

weights = weights - 2
print(weights, weights_np)
