import pytorch_lightning as pl
import torch

from zoo.small_resnet import tiny_resnet


class CifarTask(pl.LightningModule):
    def __init__(self, lr=0.05, epochs=100):
        super().__init__()
        self.save_hyperparameters()
        self.loss_fn = torch.nn.CrossEntropyLoss()
        self.net = tiny_resnet()

    def forward(self, batch):
        images, labels = batch
        logits = self.net(images)
        hit_rate = (logits.argmax(1) == labels).float().mean()
        return self.loss_fn(logits, labels), hit_rate * 100

    def training_step(self, batch, batch_idx):
        loss, hit_rate = self.forward(batch)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        loss, hit_rate = self.forward(batch)  # silent: TW104
        self.log("val/hit_rate", hit_rate)

    def test_step(self, batch, batch_idx):
        loss, hit_rate = self.forward(batch)  # silent: TW103
        self.log("test/hit_rate", hit_rate)

    def configure_optimizers(self):
        return torch.optim.SGD(self.net.parameters(), lr=self.hparams.lr, momentum=0.9, nesterov=True)
