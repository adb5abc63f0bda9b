"""Helpers for the checkpoint tests: a small model, and files that no checkpoint loader may accept."""

from __future__ import annotations

import random
from pathlib import Path

import torch


class Net(torch.nn.Module):
    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.encoder = torch.nn.Linear(4, hidden)
        self.norm = torch.nn.BatchNorm1d(hidden)
        self.head = torch.nn.Linear(hidden, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.norm(self.encoder(x))))


def make_bad_inputs(folder: Path, good_checkpoint: Path) -> dict[str, Path]:
    """Zero-byte, truncated, random-bytes, wrong-format files, a directory and a missing path."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "zero-byte": folder / "empty.pt",
        "truncated": folder / "truncated.pt",
        "random": folder / "random.pt",
        "json": folder / "config.pt",
        "plain-pickle": folder / "plain.pkl",
        "truncated-safetensors": folder / "cut.safetensors",
        "directory": folder / "a_folder.pt",
        "missing": folder / "missing.pt",
    }
    files["zero-byte"].write_bytes(b"")
    data = good_checkpoint.read_bytes()
    files["truncated"].write_bytes(data[: len(data) // 2])
    noise = random.Random(0).randbytes(4096)  # fixed: random bytes could, rarely, mimic a header
    assert noise[:4] != b"PK\x03\x04" and noise[8:9] != b"{" and noise[:1] != b"\x80"
    files["random"].write_bytes(noise)
    files["json"].write_text('{"lr": 0.1, "epochs": 3}\n')
    import pickle

    files["plain-pickle"].write_bytes(pickle.dumps({"weight": [1.0, 2.0]}))
    from trainwise.checkpoint.weights import safetensors_bytes

    blob = safetensors_bytes({"w": torch.zeros(64, 64)})
    files["truncated-safetensors"].write_bytes(blob[:200])
    files["directory"].mkdir()
    return files
