import torch.nn as nn
import torch.nn.functional as F

from pygcn.layers import GraphConv


class GraphConvNet(nn.Module):
    def __init__(self, n_in, n_hidden, n_out, dropout):
        super().__init__()
        self.first = GraphConv(n_in, n_hidden)
        self.second = GraphConv(n_hidden, n_out)
        self.dropout = dropout

    def forward(self, x, adjacency):
        x = F.dropout(F.relu(self.first(x, adjacency)), self.dropout, training=self.training)
        return F.log_softmax(self.second(x, adjacency), dim=1)
