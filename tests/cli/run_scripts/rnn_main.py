"""main.py of pytorch/examples' word_language_model, made small: no optimizer (a manual SGD update of p.data),
the best model saved whole with torch.save and loaded back. `--keep-hidden` never detaches the hidden state (and
backpropagates with retain_graph=True, as one does to silence torch's error): every step then backpropagates
through all the earlier ones."""
import argparse
import copy
import pickle

import rnn_model as model_module
import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--save", default="model.pt")
parser.add_argument("--keep-hidden", action="store_true")
args = parser.parse_args()

torch.manual_seed(0)
ntoken, bptt, batch_size, lr = 20, 5, 4, 0.5
train_data = torch.randint(0, ntoken, (101, batch_size))
val_data = torch.randint(0, ntoken, (26, batch_size))
model = model_module.RNNModel(ntoken)
criterion = nn.CrossEntropyLoss()


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def get_batch(source, i):
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


def evaluate(data_source):
    model.eval()
    total_loss = 0.0
    hidden = model.init_hidden(batch_size)
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, bptt):
            data, targets = get_batch(data_source, i)
            output, hidden = model(data, hidden)
            total_loss += len(data) * criterion(output.view(-1, ntoken), targets).item()
    return total_loss / (len(data_source) - 1)


def train():
    model.train()
    hidden = model.init_hidden(batch_size)
    for i in range(0, train_data.size(0) - 1, bptt):
        data, targets = get_batch(train_data, i)
        model.zero_grad()
        if not args.keep_hidden:
            hidden = repackage_hidden(hidden)
        output, hidden = model(data, hidden)
        loss = criterion(output.view(-1, ntoken), targets)
        loss.backward(retain_graph=args.keep_hidden)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)


best_val_loss = None
for _epoch in range(2):
    train()
    val_loss = evaluate(val_data)
    if not best_val_loss or val_loss < best_val_loss:
        with open(args.save, "wb") as f:
            torch.save(model, f)
        best_val_loss = val_loss
ema = copy.deepcopy(model)  # an EMA or SWA copy
clone = pickle.loads(pickle.dumps(model))
with open(args.save, "rb") as f:
    model = torch.load(f, weights_only=False)
torch.save(model.state_dict(), args.save + ".state")
print(f"best {best_val_loss:.4f} reloaded {evaluate(val_data):.4f}", type(ema).__name__, type(clone).__name__)
