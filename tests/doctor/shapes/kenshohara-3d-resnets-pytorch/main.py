import torch
from torch.utils.data import DataLoader

from clipnet import build_clip_net, load_kinetics_weights
from fit import fit_one_epoch
from helpers import reseed_worker
from scoring import score_epoch


def restore_weights(ckpt_file, net):
    state = torch.load(ckpt_file, map_location="cpu")  # expect: TW301
    if hasattr(net, "module"):
        net.module.load_state_dict(state["weights"])  # silent: TW302
    else:
        net.load_state_dict(state["weights"])
    return net


def restore_schedule(ckpt_file, opt):
    state = torch.load(ckpt_file, map_location="cpu")  # expect: TW301
    opt.load_state_dict(state["opt"])
    return state["round"] + 1


def run(cfg, clips_train, clips_val):
    net = build_clip_net(cfg.depth)
    if cfg.kinetics_file:
        net = load_kinetics_weights(net, cfg.kinetics_file, cfg.num_labels)
    if cfg.resume_file:
        net = restore_weights(cfg.resume_file, net)
    if cfg.gpus > 1:
        net = torch.nn.DataParallel(net)
    opt = torch.optim.SGD(net.parameters(), lr=cfg.lr, momentum=0.9)
    first = restore_schedule(cfg.resume_file, opt) if cfg.resume_file else 1
    feed = DataLoader(clips_train, batch_size=cfg.batch, shuffle=True,
                      num_workers=cfg.workers, worker_init_fn=reseed_worker)  # silent: TW201
    check = DataLoader(clips_val, batch_size=cfg.batch, num_workers=cfg.workers, worker_init_fn=reseed_worker)
    loss_fn = torch.nn.CrossEntropyLoss()
    for rnd in range(first, cfg.rounds + 1):
        fit_one_epoch(net, feed, loss_fn, opt)
        score_epoch(net, check, loss_fn)
        state = {"round": rnd, "weights": net.module.state_dict() if hasattr(net, "module") else net.state_dict(),
                 "opt": opt.state_dict()}
        torch.save(state, f"ckpt_{rnd}.pt")
