"""A real PyTorch Lightning fit with StallscopeCallback: a tiny model whose step takes
compute_s, on a DataLoader whose samples take sample_s; `devices` CPU processes (DDP over
gloo when more than one; Lightning starts the other ranks by re-running this script).

    python lightning_trainer.py '{"devices": 2, "workers": 2, "batch": 8, "sample_s": 0.06,
        "compute_s": 0.15, "batches": 60, "done_file": "/tmp/done"}'
"""
import json
import os
import sys

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from slow_data import SlowSamples, compute, linger, slow_backward

from stallscope.integrations.lightning import StallscopeCallback


class Tiny(pl.LightningModule):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, _i):
        x, y = batch
        compute(self.cfg["compute_s"])
        out = slow_backward(self.net(x), self.cfg.get("backward_s", 0))
        return torch.nn.functional.mse_loss(out, y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        c = self.cfg
        n = c["batches"] * c["batch"] * c.get("devices", 1)  # DDP gives each rank its share
        return DataLoader(SlowSamples(n, c["sample_s"]), batch_size=c["batch"],
                          num_workers=c["workers"])


def main():
    cfg = json.loads(sys.argv[1])
    devices = cfg.get("devices", 1)
    trainer = pl.Trainer(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
                         max_epochs=cfg.get("epochs", 1), logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[StallscopeCallback()])
    trainer.fit(Tiny(cfg))
    linger(cfg)


if __name__ == "__main__":
    main()
