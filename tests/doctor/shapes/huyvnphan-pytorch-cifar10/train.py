import os
from argparse import ArgumentParser

import torch
from pytorch_lightning import Trainer, seed_everything

from module import CifarTask


def main(cfg, datamodule):
    seed_everything(0)
    trainer = Trainer(deterministic=True, max_epochs=cfg.epochs, precision=cfg.precision)
    task = CifarTask(lr=cfg.lr, epochs=cfg.epochs)
    if cfg.pretrained:
        weights_file = os.path.join("zoo", "weights", cfg.arch + ".pt")
        task.net.load_state_dict(torch.load(weights_file))  # expect: TW301
    if cfg.test_only:
        trainer.test(task, datamodule=datamodule)
    else:
        trainer.fit(task, datamodule=datamodule)
        trainer.test(task, datamodule=datamodule)


if __name__ == "__main__":
    cli = ArgumentParser()
    cli.add_argument("--arch", default="tiny_resnet")
    cli.add_argument("--epochs", type=int, default=100)
    cli.add_argument("--lr", type=float, default=0.05)
    cli.add_argument("--precision", default="32")
    cli.add_argument("--pretrained", type=int, default=0)
    cli.add_argument("--test_only", type=int, default=0)
    main(cli.parse_args(), datamodule=None)
