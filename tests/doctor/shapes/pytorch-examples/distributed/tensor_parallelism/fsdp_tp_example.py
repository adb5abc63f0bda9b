import torch
from torch.distributed.fsdp import fully_shard

from toy_decoder import Decoder

dev = "cuda" if torch.cuda.is_available() else "cpu"
decoder = Decoder(vocab=1000, width=64).to(dev)
sharded = fully_shard(decoder)
adam = torch.optim.AdamW(sharded.parameters(), lr=1e-3, foreach=True)

for it in range(12):
    torch.manual_seed(it)
    tokens = torch.randint(1000, (4, 128), device=dev)
    logits = sharded(tokens)
    logits.sum().backward()
    adam.step()  # expect: TW105
    print(f"2D iteration {it} done")
