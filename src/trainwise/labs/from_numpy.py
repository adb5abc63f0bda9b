"""Fundamental 1: on the CPU, ``torch.from_numpy`` and ``.numpy()`` share memory with the other side, so an
in-place edit of one silently changes the other; ``torch.tensor`` (or ``.clone()``/``.copy()``) copies."""

from __future__ import annotations

from trainwise.labs import Lab, LabResult


def measure() -> LabResult:
    import numpy as np
    import torch

    from trainwise.device import move_to_device

    rng = np.random.default_rng(0)
    original = rng.standard_normal(1000).astype(np.float32)
    n = original.size

    def changed_by_array_edit(convert) -> int:
        """Elements of the tensor made from an array that change when the array is edited in place."""
        array = original.copy()
        tensor = convert(array)
        before = tensor.clone()
        array *= 2.0  # in place, as a normalisation or augmentation written on the NumPy side would
        return int((tensor != before).sum())

    figures: dict[str, object] = {"elements": n}
    ways = (
        ("torch.from_numpy(a)", torch.from_numpy),
        ("torch.as_tensor(a)", torch.as_tensor),
        ("move_to_device(torch.from_numpy(a), 'cpu')", lambda a: move_to_device(torch.from_numpy(a), "cpu")),
        ("torch.tensor(a)", torch.tensor),
        ("torch.as_tensor(a).clone()", lambda a: torch.as_tensor(a).clone()),
    )
    for label, convert in ways:
        figures[f"{label}: tensor elements changed by editing a in place"] = changed_by_array_edit(convert)

    def changed_by_tensor_edit(convert) -> int:
        """Elements of the array made from a tensor that change when the tensor is edited in place."""
        tensor = torch.from_numpy(original.copy())
        array = convert(tensor)
        before = array.copy()
        tensor.add_(1.0)  # an in-place update, as an optimizer step does to a parameter
        return int((array != before).sum())

    figures["t.numpy(): array elements changed by editing t in place"] = changed_by_tensor_edit(lambda t: t.numpy())
    figures["t.numpy().copy(): array elements changed by editing t in place"] = changed_by_tensor_edit(
        lambda t: t.numpy().copy())

    # A loop that fills one preallocated NumPy buffer per batch and keeps the batches (for a replay buffer, a
    # validation cache): every kept from_numpy batch is the buffer, so all of them end up equal to the last.
    buffer = np.empty((4, 3), dtype=np.float32)
    kept: dict[str, list] = {"torch.from_numpy(buffer)": [], "torch.tensor(buffer)": []}
    batches = 8
    for _ in range(batches):
        buffer[:] = rng.standard_normal(buffer.shape)
        kept["torch.from_numpy(buffer)"].append(torch.from_numpy(buffer))  # noqa: TW116 (the wrong way, on purpose)
        kept["torch.tensor(buffer)"].append(torch.tensor(buffer))
    for label, tensors in kept.items():
        distinct = len({tuple(t.flatten().tolist()) for t in tensors})
        figures[f"{label}: distinct batches among {batches} kept"] = distinct

    shared = figures["torch.from_numpy(a): tensor elements changed by editing a in place"]
    as_tensor = figures["torch.as_tensor(a): tensor elements changed by editing a in place"]
    moved = figures["move_to_device(torch.from_numpy(a), 'cpu'): tensor elements changed by editing a in place"]
    copied = max(figures["torch.tensor(a): tensor elements changed by editing a in place"],
                 figures["torch.as_tensor(a).clone(): tensor elements changed by editing a in place"])
    back = figures["t.numpy(): array elements changed by editing t in place"]
    back_copied = figures["t.numpy().copy(): array elements changed by editing t in place"]
    distinct_shared = figures[f"torch.from_numpy(buffer): distinct batches among {batches} kept"]
    distinct_copied = figures[f"torch.tensor(buffer): distinct batches among {batches} kept"]
    reading = (
        f"Doubling a NumPy array in place changed {shared} of {n} elements of its torch.from_numpy tensor ({as_tensor} "
        f"through torch.as_tensor, {moved} after move_to_device to the CPU it was on) and {copied} of a torch.tensor "
        f"copy, and an in-place edit of a tensor changed {back} elements of its .numpy() ({back_copied} of a copy); "
        f"of {batches} batches kept from one reused buffer, {distinct_shared} stayed distinct with from_numpy, "
        f"{distinct_copied} with torch.tensor."
    )
    shown = (shared == n and as_tensor == n and moved == n and copied == 0 and back == n and back_copied == 0
             and distinct_shared == 1 and distinct_copied == batches)
    return LabResult(figures=figures, reading=reading, shown=shown)


LAB = Lab(name="from-numpy", fundamental=1, title="from_numpy and .numpy() share memory; torch.tensor copies",
          codes=("TW116", "TW112"), measure=measure)
