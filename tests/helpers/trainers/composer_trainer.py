"""A real MosaicML Composer fit with StallscopeCallback, on a Mosaic Streaming dataset: a
StreamingDataset copies the MDS shards the test wrote (``remote``, a local directory)
into its own cache (``local``) and each sample takes sample_s more (the injected slow
dataset); a tiny model whose forward takes compute_s. One CPU process.

    python composer_trainer.py '{"remote": "/tmp/shards", "local": "/tmp/cache", "workers": 2,
        "batch": 8, "sample_s": 0.06, "compute_s": 0.15, "batches": 60, "done_file": "/tmp/done"}'
"""
import json
import os
import sys

import torch
from composer import Trainer
from composer.models import ComposerModel
from streaming import StreamingDataset
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from slow_data import compute, linger

from stallscope.integrations.composer import StallscopeCallback


class SlowStreaming(StreamingDataset):
    """Each sample costs sample_s on top of its read from the shard (a decode, say)."""

    def __init__(self, sample_s, **kwargs):
        super().__init__(**kwargs)
        self.sample_s = sample_s

    def get_item(self, sample_id, retry=7):
        compute(self.sample_s)
        return super().get_item(sample_id, retry)


class Tiny(ComposerModel):
    def __init__(self, compute_s):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.compute_s = compute_s

    def forward(self, batch):
        compute(self.compute_s)
        return self.net(batch["x"]).squeeze(-1)

    def loss(self, outputs, batch, *args, **kwargs):
        return torch.nn.functional.mse_loss(outputs, batch["y"])


def main():
    cfg = json.loads(sys.argv[1])
    data = SlowStreaming(cfg["sample_s"], remote=cfg["remote"], local=cfg["local"],
                         batch_size=cfg["batch"], shuffle=False)
    loader = DataLoader(data, batch_size=cfg["batch"], num_workers=cfg["workers"])
    model = Tiny(cfg["compute_s"])
    trainer = Trainer(model=model, train_dataloader=loader, device="cpu",
                      max_duration="%dba" % cfg["batches"],
                      optimizers=torch.optim.SGD(model.parameters(), lr=0.01),
                      progress_bar=False, log_to_console=False, loggers=[],
                      callbacks=[StallscopeCallback()])
    trainer.fit()
    linger(cfg)


if __name__ == "__main__":
    main()
