import torch

from open_clip_train.precision import pick_autocast


def run_backward(loss, scaler):
    if scaler is not None:
        scaler.scale(loss).backward()  # silent: TW401
    else:
        loss.backward()


def build_step(model, opt, autocast):
    def step(images, texts):
        with autocast():
            loss = model(images, texts)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    return step


def cached_step(state, autocast, cfg):
    if state.step_fn is not None:
        return state.step_fn
    step_fn = torch.compile(  # silent: TW115
        build_step(state.model, state.opt, autocast),
        mode=cfg.compile_mode,
    )
    state.step_fn = step_fn
    return state.step_fn


def epoch(state, batches, cfg):
    autocast = pick_autocast(cfg.precision)
    by_hand = state.scaler is not None
    step = None if by_hand else cached_step(state, autocast, cfg)
    for images, texts in batches:
        if step is not None:
            step(images, texts)
            continue
        with autocast():
            loss = state.model(images, texts)
        run_backward(loss, state.scaler)
        state.scaler.step(state.opt)
        state.scaler.update()
        state.opt.zero_grad(set_to_none=True)
