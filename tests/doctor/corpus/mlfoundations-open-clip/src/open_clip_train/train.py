# Public-code corpus case (trainwise doctor, issue 30): mlfoundations-open-clip/src/open_clip_train/train.py
# Source: https://github.com/mlfoundations/open_clip/blob/89fb801f1e6087880e951fc8354b8a2077b79c6d/src/open_clip_train/train.py
# Repository: mlfoundations/open_clip at commit 89fb801f1e6087880e951fc8354b8a2077b79c6d
# Path: src/open_clip_train/train.py
# Licence: MIT (copyright its authors); a verbatim excerpt for testing: only the lines named
# below are kept, unchanged but for the markers at line ends.
# Markers: `# expect: TWxxx` a real bug that must be reported; `# silent: TWxxx` a look-alike that
# must not be reported; `# latent: TWxxx` the pattern is there but has no effect in this program.

# --- lines 12-15 ---
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel.distributed import DistributedDataParallel
# --- lines 48-48 ---
from open_clip_train.precision import get_autocast
# --- lines 145-149 ---
def backward(total_loss, scaler):
    if scaler is not None:
        scaler.scale(total_loss).backward()  # silent: TW401
    else:
        total_loss.backward()
# --- lines 188-198 ---
def _get_compiled_train_step(state: TrainState, autocast, args):
    assert state.optimizer is not None, "_get_compiled_train_step requires state.optimizer."
    if state.compiled_train_step is not None:
        return state.compiled_train_step

    compiled_train_step = torch.compile(  # silent: TW115
        _make_train_step_no_accum_no_scaler(state.task, state.optimizer, autocast, args),
        **_torch_compile_kwargs(args),
    )
    state.compiled_train_step = compiled_train_step
    return state.compiled_train_step
# --- lines 337-368 ---
def train_one_epoch(state: TrainState, data, args, tb_writer=None):
    task = state.task
    optimizer = state.optimizer
    scaler = state.scaler
    scheduler = state.scheduler
    epoch = state.epoch
    assert optimizer is not None, "train_one_epoch requires state.optimizer."
    if not args.skip_scheduler:
        assert scheduler is not None, "train_one_epoch requires state.scheduler unless --skip-scheduler is set."

    device = torch.device(args.device)
    autocast = get_autocast(
        args.precision,
        device_type=device.type,
        fsdp=getattr(args, 'fsdp', False),
    )
    input_dtype = get_input_dtype(args.precision)
    compile_step = (
        getattr(args, "torchcompile", False)
        and getattr(args, "torchcompile_strategy", "task") == "step"
    )
    eager_step = args.accum_freq > 1 or scaler is not None
    if compile_step and eager_step:
        raise ValueError(
            "--torchcompile-strategy step requires --accum-freq 1 and a precision without GradScaler."
        )
    if eager_step:
        train_step = None
    elif compile_step:
        train_step = _get_compiled_train_step(state, autocast, args)
    else:
        train_step = _make_train_step_no_accum_no_scaler(task, optimizer, autocast, args)
