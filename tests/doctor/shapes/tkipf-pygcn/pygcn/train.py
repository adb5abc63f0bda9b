import torch
import torch.nn.functional as F

from pygcn.models import GraphConvNet
from pygcn.utils import hit_rate, load_graph

torch.manual_seed(11)
use_gpu = torch.cuda.is_available()
adjacency, x, y, train_ids, val_ids, test_ids = load_graph("citations")
gnn = GraphConvNet(x.shape[1], 32, int(y.max()) + 1, dropout=0.4)
adam = torch.optim.Adam(gnn.parameters(), lr=0.01, weight_decay=5e-4)
if use_gpu:
    gnn.cuda()
    adjacency, x, y = adjacency.cuda(), x.cuda(), y.cuda()


def train(epoch, quick=False):
    gnn.train()
    adam.zero_grad()  # silent: TW105
    scores = gnn(x, adjacency)  # silent: TW104
    train_loss = F.nll_loss(scores[train_ids], y[train_ids])
    train_loss.backward()
    adam.step()
    if not quick:
        gnn.eval()
        scores = gnn(x, adjacency)  # expect: TW104
    val_loss = F.nll_loss(scores[val_ids], y[val_ids])
    print(epoch, train_loss.item(), val_loss.item(), hit_rate(scores[val_ids], y[val_ids]).item())


def test():
    gnn.eval()
    scores = gnn(x, adjacency)  # expect: TW104
    print("test", F.nll_loss(scores[test_ids], y[test_ids]).item(), hit_rate(scores[test_ids], y[test_ids]).item())


for epoch in range(150):
    train(epoch)
test()
