"""A real Ray Train run: a local Ray cluster, a TorchTrainer of ``workers`` training
workers (gloo, CPU), each iterating its Ray Data shard with ``iter_torch_batches``
watched by ``watch_shard`` (rank from ``ray.train.get_context()``). The dataset's rows
take ``sample_s`` each (a sleep in a ``map``); each step takes ``compute_s``.

    python ray_trainer.py '{"workers": 2, "batch": 8, "sample_s": 0.03, "compute_s": 0.05,
        "batches": 60, "done_file": "/tmp/d", "out": "/tmp/o"}'
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from slow_data import compute, linger


def train_loop(cfg):
    import ray.train

    from stallscope.hook import channel
    from stallscope.integrations.ray_train import identity, watch_shard

    shard = ray.train.get_dataset_shard("train")
    batches = 0
    for _batch in watch_shard(shard.iter_torch_batches(batch_size=cfg["batch"], prefetch_batches=1)):
        compute(cfg["compute_s"])
        batches += 1
    channel.get().flush()
    with open("%s-rank%d.json" % (cfg["out"], identity()["rank"]), "w") as f:
        json.dump({"batches": batches, "identity": identity(), "pid": os.getpid()}, f)
    # the agent keeps a rank while its process lives: stay until the test has read it
    deadline = time.monotonic() + cfg.get("linger_s", 120)
    while not os.path.exists(cfg["done_file"]) and time.monotonic() < deadline:
        time.sleep(0.2)


def slow_row(row, sample_s):
    time.sleep(sample_s)
    return row


def main():
    import ray
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    cfg = json.loads(sys.argv[1])
    ray.init(num_cpus=cfg.get("cpus", 4), include_dashboard=False, log_to_driver=True)
    n = cfg["batches"] * cfg["batch"] * cfg["workers"]
    data = ray.data.range(n).map(slow_row, fn_kwargs={"sample_s": cfg["sample_s"]},
                                 concurrency=cfg.get("map_tasks", 1))
    TorchTrainer(train_loop, train_loop_config=cfg, datasets={"train": data},
                 scaling_config=ScalingConfig(num_workers=cfg["workers"], use_gpu=False)).fit()
    linger(cfg)


if __name__ == "__main__":
    main()
