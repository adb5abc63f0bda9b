"""The CUDA paths, checked on a real GPU in one short run (prints what it checked; exits 1 on a failure).

    python benchmarks/gpu_check.py                 # on a machine with CUDA; on CPU it says so and exits 0
    python benchmarks/gpu_check.py --json          # the same, and the timing report as the last line (JSON)
    python benchmarks/gpu_check.py --cpu-dry-run   # the timing path only, on CPU, with a tiny model

Checks: device "auto" picks CUDA; precision "auto" picks bf16 (or fp16 with a scaler on older GPUs); a bf16 and
an fp16 Trainer run of the demo reach the CPU accuracy; fp16 steps go through GradScaler; batches from pinned
memory arrive with non-blocking copies; ``batch_size="auto"`` recovers from a real CUDA out-of-memory error
(the process capped at 4 GiB) to the weights of a run at the fitting micro-batch. Then run
`benchmarks/overhead.py` on the same machine for the ratios.

Then it times the Trainer against a minimal hand-written loop on a GPT-2-small-shaped decoder (12 layers, 12
heads, d_model 768, vocab 50257, context 1024, tied embeddings, ``scaled_dot_product_attention`` with
``is_causal=True``) under bf16 autocast, on random tokens. Both sides build the model from the same seed, train
with AdamW (same lr and weight decay, none on biases and LayerNorms, as the Trainer's default groups, and torch's
fused kernel on both sides, as the Trainer picks it: the ratio is the loop's own cost, not the kernel's) on batches
of dicts ``{"input_ids", "labels"}`` from a DataLoader with pinned memory, and take the same number of steps:

- hand: ``zero_grad(set_to_none=True)``, forward under ``torch.autocast("cuda", dtype=torch.bfloat16)``,
  cross-entropy over every token, backward, ``step``, ``loss.item()`` (non-blocking copies from pinned memory);
- trainer: ``Trainer(precision="bf16", count="tokens", progress="off", checkpoints=False, plot=False)`` as
  shipped otherwise (runtime guards on, accuracy counted, a log line every ``log_every`` steps); the model
  returns logits and the Trainer computes the token cross-entropy itself.

A global optimizer step hook timestamps the steps on both sides: it synchronises with the device after the
last warm-up step and after the last timed step only, so the timed span holds exactly ``--steps`` optimizer
steps and everything a loop does between them (data loading, copies, metrics, guards), and none of the setup
or the end-of-fit work. The sides alternate for ``--rounds`` rounds, each with a fresh model; the report gives
median tokens/s [min-max], model-FLOPs utilisation (MFU) and the ratio trainer/hand, of the medians and per round.

MFU = tokens/s * FLOPs per token / peak: FLOPs per token = 6N + 12 * L * H * Q * T (PaLM appendix B, as
nanoGPT's ``estimate_mfu``), N the parameters that multiply per token (all but the position embedding; the
token embedding counts once, as the tied output layer), L layers, H heads, Q head size, T context. The peak is
the GPU's dense bf16 rate: 989 TFLOP/s for H100 SXM and H200, 756 for H100 PCIe, 312 for A100, else
``--peak-tflops`` (without it the MFU is printed as "unknown peak").

Nothing here asserts a time: the numbers mean something as a ratio within one run, on one machine.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

LR = 6e-4
WEIGHT_DECAY = 0.01
# (substring of torch.cuda.get_device_name(), dense bf16 FLOP/s); the first match wins
PEAK_BF16_FLOPS = (("H100 PCIE", 756e12), ("H100", 989e12), ("H200", 989e12), ("A100", 312e12))


@dataclasses.dataclass(frozen=True)
class Shape:
    layers: int
    heads: int
    d_model: int
    vocab: int
    context: int
    batch_size: int
    warmup: int
    steps: int
    rounds: int


GPT2_SMALL = Shape(layers=12, heads=12, d_model=768, vocab=50257, context=1024, batch_size=8, warmup=5, steps=30,
                   rounds=5)
DRY_RUN = Shape(layers=2, heads=2, d_model=64, vocab=256, context=32, batch_size=4, warmup=2, steps=6, rounds=2)


# -- the model and the data ------------------------------------------------------------------------------


class Block(nn.Module):
    """Pre-LayerNorm transformer block: causal self-attention, then a 4x GELU MLP, each with a residual."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln_2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, tokens, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(batch, tokens, width))
        return x + self.out(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    """A decoder-only transformer of GPT-2's shape: learned positions, tied input and output embeddings.

    ``forward(input_ids)`` returns logits ``(batch, tokens, vocab)``; the loss is the caller's."""

    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.wte = nn.Embedding(shape.vocab, shape.d_model)
        self.wpe = nn.Embedding(shape.context, shape.d_model)
        self.blocks = nn.ModuleList(Block(shape.d_model, shape.heads) for _ in range(shape.layers))
        self.ln_f = nn.LayerNorm(shape.d_model)
        self.lm_head = nn.Linear(shape.d_model, shape.vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for module in self.modules():  # GPT-2's initialisation
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for block in self.blocks:  # residual projections scaled by 1/sqrt(2 * layers)
            for residual in (block.proj, block.out):
                nn.init.normal_(residual.weight, mean=0.0, std=0.02 / math.sqrt(2 * shape.layers))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.wte(input_ids) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class RandomTokens(torch.utils.data.Dataset):
    """``samples`` rows of random token ids; each item is ``{"input_ids": row[:-1], "labels": row[1:]}``."""

    def __init__(self, samples: int, context: int, vocab: int, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(vocab, (samples, context + 1), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        row = self.tokens[index]
        return {"input_ids": row[:-1], "labels": row[1:]}


def flop_parameters(model: nn.Module) -> int:
    """Parameters that multiply per token: every one (the tied embedding once) but the position embedding."""
    return sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()  # type: ignore[union-attr]


def flops_per_token(shape: Shape, parameters: int) -> float:
    """Training FLOPs per token, forward and backward: 6N + 12 * L * H * Q * T (PaLM, nanoGPT)."""
    return 6 * parameters + 12 * shape.layers * shape.heads * (shape.d_model // shape.heads) * shape.context


def peak_bf16_flops(device_name: str, peak_tflops: float | None = None) -> tuple[float | None, str]:
    """The dense bf16 peak FLOP/s of a GPU by its name (``--peak-tflops`` first), and where it came from."""
    if peak_tflops is not None:
        return peak_tflops * 1e12, f"--peak-tflops {peak_tflops:g}"
    upper = device_name.upper()
    for key, flops in PEAK_BF16_FLOPS:
        if key in upper:
            return flops, f"{key} dense bf16"
    return None, "unknown peak"


# -- the two sides -----------------------------------------------------------------------------------------


class StepTimer:
    """A global optimizer-step hook: the time of the ``warmup``-th step and of the ``warmup + steps``-th,
    each after synchronising with the device (the only synchronisations it adds)."""

    def __init__(self, warmup: int, steps: int, device: torch.device) -> None:
        self.warmup, self.steps, self.device = warmup, steps, device
        self.count = 0
        self.start: float | None = None
        self.end: float | None = None

    def __call__(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.count += 1
        if self.count in (self.warmup, self.warmup + self.steps):
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            now = time.perf_counter()
            if self.count == self.warmup:
                self.start = now
            else:
                self.end = now

    @contextlib.contextmanager
    def installed(self) -> Iterator[StepTimer]:
        handle = register_optimizer_step_post_hook(self)
        try:
            yield self
        finally:
            handle.remove()

    @property
    def seconds(self) -> float:
        if self.start is None or self.end is None:
            raise RuntimeError(f"only {self.count} optimizer steps were taken, {self.warmup + self.steps} expected")
        return self.end - self.start


def run_hand(shape: Shape, dataset: RandomTokens, device: torch.device, seed: int) -> dict[str, Any]:
    """The minimal loop: zero_grad, forward under bf16 autocast, token cross-entropy, backward, step, item."""
    torch.manual_seed(seed)
    model = GPT(shape).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]  # no weight decay on biases and LayerNorms
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}], lr=LR,
                                  weight_decay=WEIGHT_DECAY, fused=True)  # the Trainer's default kernel
    loader = torch.utils.data.DataLoader(dataset, batch_size=shape.batch_size, shuffle=True,
                                         generator=torch.Generator().manual_seed(seed),
                                         pin_memory=device.type == "cuda")
    losses = []
    model.train()
    with StepTimer(shape.warmup, shape.steps, device).installed() as timer:
        for batch in loader:
            input_ids = batch["input_ids"].to(device, non_blocking=True)
            labels = batch["labels"].to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                logits = model(input_ids)
                loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return {"seconds": timer.seconds, "loss": statistics.fmean(losses), "steps": timer.count, "guards": []}


def run_trainer(shape: Shape, dataset: RandomTokens, device: torch.device, seed: int) -> dict[str, Any]:
    """The Trainer on the same data and model (built from the same seed), one epoch, bf16, token counts."""
    from trainwise import Trainer

    with tempfile.TemporaryDirectory() as run_dir, StepTimer(shape.warmup, shape.steps, device).installed() as timer:
        trainer = Trainer(epochs=1, lr=LR, weight_decay=WEIGHT_DECAY, batch_size=shape.batch_size, seed=seed,
                          device=device.type, precision="bf16", count="tokens", progress="off", checkpoints=False,
                          plot=False, run_dir=run_dir)
        result = trainer.fit(lambda: GPT(shape), dataset)
        # the runtime guards' findings, which progress="off" does not print
        with open(result.run_dir / "metrics.jsonl", encoding="utf-8") as log:
            guards = [record for record in map(json.loads, log) if record.get("kind") == "guard"]
    return {"seconds": timer.seconds, "loss": result.last["train_loss"], "steps": result.steps,
            "guards": [f"{g.get('code')} {g.get('where', '')}: {g.get('message', '')}" for g in guards]}


SIDES: dict[str, Callable[[Shape, RandomTokens, torch.device, int], dict[str, Any]]] = {
    "hand": run_hand, "trainer": run_trainer}


def time_gpt(shape: Shape, device: torch.device, *, seed: int = 0, peak_tflops: float | None = None,
             log: Callable[[str], None] = print) -> dict[str, Any]:
    """Alternate the two sides for ``shape.rounds`` rounds; tokens/s, MFU and the ratio trainer/hand."""
    dataset = RandomTokens((shape.warmup + shape.steps) * shape.batch_size, shape.context, shape.vocab, seed)
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        parameters = flop_parameters(GPT(shape))
    per_token = flops_per_token(shape, parameters)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak, peak_source = peak_bf16_flops(name, peak_tflops)
    tokens = shape.steps * shape.batch_size * shape.context
    log(f"GPT: {shape.layers} layers, {shape.heads} heads, d_model {shape.d_model}, vocab {shape.vocab}, context "
        f"{shape.context}, {parameters / 1e6:.1f}M parameters for FLOPs; batch {shape.batch_size} "
        f"({shape.batch_size * shape.context} tokens/step), bf16 autocast on {name}")
    log(f"  {per_token / 1e9:.3f} GFLOP per token (6N + 12*L*H*Q*T); peak "
        + (f"{peak / 1e12:g} TFLOP/s ({peak_source})" if peak else f"not known ({peak_source}; pass --peak-tflops)")
        + f"; {shape.rounds} rounds of {shape.warmup} warm-up + {shape.steps} timed steps per side")
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for round_ in range(shape.rounds):
        order = list(SIDES) if round_ % 2 == 0 else list(reversed(SIDES))
        for side in order:
            run = SIDES[side](shape, dataset, device, seed)
            run["tokens_per_s"] = tokens / run["seconds"]
            runs[side].append(run)
            gc.collect()  # the last side's model, gradients and optimizer state go before the next side starts
            if device.type == "cuda":
                torch.cuda.empty_cache()
        log(f"  round {round_ + 1}/{shape.rounds}: " + ", ".join(
            f"{side} {runs[side][-1]['tokens_per_s']:,.0f} tokens/s" for side in SIDES))
    report: dict[str, Any] = {
        "device": name, "shape": dataclasses.asdict(shape), "flop_parameters": parameters,
        "flops_per_token": per_token, "peak_flops": peak, "peak_source": peak_source, "sides": {},
    }
    for side, side_runs in runs.items():
        rates = [r["tokens_per_s"] for r in side_runs]
        median = statistics.median(rates)
        report["sides"][side] = {
            "tokens_per_s": median, "tokens_per_s_min": min(rates), "tokens_per_s_max": max(rates),
            "mfu": median * per_token / peak if peak else None,
            "mean_loss": side_runs[0]["loss"], "guards": sorted({g for r in side_runs for g in r["guards"]}),
        }
    pair = [t["tokens_per_s"] / h["tokens_per_s"] for h, t in zip(runs["hand"], runs["trainer"])]
    report["ratio"] = report["sides"]["trainer"]["tokens_per_s"] / report["sides"]["hand"]["tokens_per_s"]
    report["round_ratios"] = pair
    _print_report(report, log)
    return report


def _print_report(report: dict[str, Any], log: Callable[[str], None]) -> None:
    log(f"  {'side':<8} {'tokens/s median [min-max]':<36} {'MFU':>12}  mean train loss")
    for side, entry in report["sides"].items():
        rate = f"{entry['tokens_per_s']:,.0f} [{entry['tokens_per_s_min']:,.0f}-{entry['tokens_per_s_max']:,.0f}]"
        mfu = "unknown peak" if entry["mfu"] is None else f"{entry['mfu']:.1%}"
        log(f"  {side:<8} {rate:<36} {mfu:>12}  {entry['mean_loss']:.4f}")
    pair = report["round_ratios"]
    log(f"  ratio trainer/hand tokens/s: {report['ratio']:.3f} (per round: median {statistics.median(pair):.3f} "
        f"[{min(pair):.3f}-{max(pair):.3f}])")
    for finding in report["sides"]["trainer"]["guards"]:
        log(f"  trainer guard: {finding}")


# -- the CUDA paths ------------------------------------------------------------------------------------------


def check_cuda_paths() -> list[str]:
    """Device and precision choice, pinned copies, bf16 and fp16 demo runs; the failures, if any."""
    import trainwise as tw
    from trainwise.demo import DigitsCNN, digits_datasets

    failures = []
    choice = tw.resolve_device("auto")
    policy = tw.resolve_precision("auto", choice.device)
    print(f"device {choice.device} ({choice.reason}); precision {policy.name} ({policy.reason})")
    if choice.device.type != "cuda":
        failures.append("device auto did not pick CUDA")
    pinned = {"x": torch.ones(1024, 1024).pin_memory()}
    moved = tw.move_to_device(pinned, choice.device)
    torch.cuda.synchronize()
    if not moved["x"].is_cuda or not torch.equal(moved["x"].cpu(), pinned["x"]):
        failures.append("pinned non-blocking copy")
    for precision in ("bf16", "fp16"):
        if precision == "bf16" and not torch.cuda.is_bf16_supported():
            continue
        tw.seed_everything(0)
        train, val = digits_datasets(0)
        with tempfile.TemporaryDirectory() as run_dir:
            result = tw.Trainer(epochs=12, lr=3e-3, batch_size=64, precision=precision, progress="off",
                                run_dir=run_dir, plot=False).fit(DigitsCNN(), train, val)
        accuracy = result.last["val_accuracy"]
        print(f"{precision}: val accuracy {accuracy:.4f} in {result.seconds:.1f} s ({result.steps} steps)")
        if accuracy < 0.95:
            failures.append(f"{precision} accuracy {accuracy:.4f} < 0.95")
    return failures


def check_oom_recovery(cap_gib: float = 4.0) -> list[str]:
    """batch_size="auto" against a real CUDA out-of-memory error: with this process capped at ``cap_gib``, an
    effective batch whose activations need about 8 GiB must halve until it fits and train to the weights of a
    run that used the fitting micro-batch from the start (allclose; GPU sums are not bitwise reproducible)."""
    import trainwise as tw

    failures: list[str] = []
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gib * 2**30 / total))
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(65536, 1024, generator=g), torch.randint(0, 10, (65536,),
                                                                                              generator=g))

    def model() -> nn.Module:  # 16,384 activations a sample: 65,536 samples hold about 8 GiB for backward
        return nn.Sequential(nn.Linear(1024, 16384), nn.ReLU(), nn.Linear(16384, 10))

    def fit(batch_size: Any, run_dir: str) -> tuple[nn.Module, list[dict[str, Any]]]:
        result = tw.Trainer(epochs=1, batch_size=batch_size, effective_batch=65536, precision="fp32", device="cuda",
                            progress="off", checkpoints=False, plot=False, guards="off", run_dir=run_dir,
                            seed=0).fit(model, data)
        return result.model, [r for r in tw.read_log(run_dir) if r["kind"] == "oom"]

    try:
        with tempfile.TemporaryDirectory() as folder:
            auto, ooms = fit("auto", f"{folder}/auto")
            for record in ooms:
                print(record["message"])
            if not ooms:
                failures.append(f"no out-of-memory error under a {cap_gib} GiB cap: the check proved nothing")
                return failures
            size = ooms[-1]["micro_batch"]
            reference, _ = fit(size, f"{folder}/reference")
            diff = max((a - b).abs().max().item() for a, b in zip(auto.parameters(), reference.parameters()))
            print(f"OOM recovery: trained at micro-batch {size} x {ooms[-1]['micro_batches']}; largest weight "
                  f"difference from a run at {size} from the start {diff:.2e}")
            if not diff < 1e-4:
                failures.append(f"OOM recovery: weights differ by {diff:.2e} from the run at micro-batch {size}")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
    return failures


def timing_failures(report: dict[str, Any]) -> list[str]:
    """A side that took no time or whose loss is not finite did not do the work (no time is asserted)."""
    failures = []
    for side, entry in report["sides"].items():
        if not entry["tokens_per_s"] > 0 or not math.isfinite(entry["tokens_per_s"]):
            failures.append(f"{side}: tokens/s {entry['tokens_per_s']}")
        if not math.isfinite(entry["mean_loss"]):
            failures.append(f"{side}: mean train loss {entry['mean_loss']}")
    return failures


def _shape(args: argparse.Namespace) -> Shape:
    base = DRY_RUN if args.cpu_dry_run else GPT2_SMALL
    given = {field.name: getattr(args, field.name) for field in dataclasses.fields(Shape)
             if getattr(args, field.name) is not None}
    return dataclasses.replace(base, **given)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    options = parser.add_argument_group("the GPT timing (defaults: GPT-2 small; the tiny model with --cpu-dry-run)")
    for field in dataclasses.fields(Shape):
        flag = "--" + field.name.replace("_", "-")
        options.add_argument(flag, type=int, default=None, metavar="N",
                             help=f"{GPT2_SMALL.__dict__[field.name]}; dry run {DRY_RUN.__dict__[field.name]}")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the GPU's dense bf16 peak, for MFU (known: H100, H200, A100)")
    parser.add_argument("--seed", type=int, default=0, help="model, data and order seed (0)")
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="only the timing path, on CPU with a tiny model (CPU bf16 autocast), no CUDA needed")
    parser.add_argument("--json", action="store_true", help="print the timing report as JSON, on the last line")
    args = parser.parse_args(argv)
    shape = _shape(args)
    if min(dataclasses.astuple(shape)) < 1:
        parser.error("every size, count and --warmup must be at least 1")
    if shape.d_model % shape.heads:
        parser.error(f"--d-model {shape.d_model} must be a multiple of --heads {shape.heads}")

    if args.cpu_dry_run:
        failures = []
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        print("no CUDA device here; nothing to check")
        return 0
    else:
        failures = check_cuda_paths() + check_oom_recovery()
        device = torch.device("cuda")
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)  # a dry run only shows the path works: one core, steadier on a shared machine
    try:
        report = time_gpt(shape, device, seed=args.seed, peak_tflops=args.peak_tflops)
    finally:
        torch.set_num_threads(threads)
    failures += timing_failures(report)
    for failure in failures:
        print(f"FAILED: {failure}")
    if args.json:
        print(json.dumps(report))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
