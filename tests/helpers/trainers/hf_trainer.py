"""A real Hugging Face run: transformers' Trainer with StallscopeCallback ("trainer"),
or a plain loop over an accelerate-prepared loader watched with watch_prepared
("accelerate"). A tiny model whose forward takes compute_s, on a DataLoader whose samples
take sample_s.

    python hf_trainer.py '{"mode": "trainer", "workers": 2, "batch": 8, "sample_s": 0.06,
        "compute_s": 0.15, "batches": 60, "done_file": "/tmp/done", "out": "/tmp/hf"}'
"""
import json
import os
import sys

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from slow_data import SlowSamples, compute, linger, slow_backward


class Tiny(torch.nn.Module):
    def __init__(self, compute_s, backward_s=0):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.compute_s, self.backward_s = compute_s, backward_s

    def forward(self, x, labels=None):
        compute(self.compute_s)
        out = slow_backward(self.net(x), self.backward_s)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


def with_trainer(cfg):
    from transformers import Trainer, TrainingArguments

    from stallscope.integrations.huggingface import StallscopeCallback

    data = SlowSamples(cfg["batches"] * cfg["batch"], cfg["sample_s"], as_dict=True)
    args = TrainingArguments(output_dir=cfg["out"], per_device_train_batch_size=cfg["batch"],
                             dataloader_num_workers=cfg["workers"], max_steps=cfg["batches"],
                             use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
                             disable_tqdm=True, remove_unused_columns=False)
    Trainer(model=Tiny(cfg["compute_s"], cfg.get("backward_s", 0)), args=args, train_dataset=data,
            callbacks=[StallscopeCallback()]).train()


def with_accelerate(cfg):
    from accelerate import Accelerator

    from stallscope.integrations.huggingface import watch_prepared

    accelerator = Accelerator(cpu=True)
    model = Tiny(cfg["compute_s"])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowSamples(cfg["batches"] * cfg["batch"], cfg["sample_s"], as_dict=True),
                        batch_size=cfg["batch"], num_workers=cfg["workers"])
    model, opt, loader = accelerator.prepare(model, opt, loader)
    for batch in watch_prepared(loader):
        loss = model(**batch)["loss"]
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()


def main():
    cfg = json.loads(sys.argv[1])
    (with_accelerate if cfg.get("mode") == "accelerate" else with_trainer)(cfg)
    linger(cfg)


if __name__ == "__main__":
    main()
