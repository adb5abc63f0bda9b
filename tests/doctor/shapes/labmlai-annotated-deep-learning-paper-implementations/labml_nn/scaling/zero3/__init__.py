import torch
from torch import nn


class ShardedBlock(nn.Module):
    FROZEN, TRAINED = 0, 1

    def __init__(self, inner: nn.Module, rank: int, ranks: int):
        super().__init__()
        self.rank, self.ranks = rank, ranks
        sizes = [self._share(p.numel()) for p in inner.parameters()]
        with torch.no_grad():
            self.pieces = [nn.Parameter(torch.zeros(n), requires_grad=k == self.TRAINED)  # silent: TW114
                           for k, n in enumerate(sizes[:2])]

    def _share(self, total: int) -> int:
        return (total + self.ranks - 1) // self.ranks

    def optimizer_shard(self) -> list[nn.Parameter]:
        if self.pieces[self.TRAINED].numel() == 0:
            return []
        return [self.pieces[self.TRAINED]]
