"""Real training loops over the loaders users run (issue 34), each watched with
``stallscope.watch`` and fed by samples that take ``sample_s`` (a sleep), with a step of
``compute_s``. Writes what it saw to ``out`` (JSON) and lingers until ``done_file``.

    python loaders_trainer.py '{"loader": "stateful", "workers": 2, "batch": 8,
        "sample_s": 0.06, "compute_s": 0.15, "batches": 70, "done_file": "/tmp/d", "out": "/tmp/o"}'

loader: "stateful" (torchdata StatefulDataLoader; halfway its state_dict() is taken through
the watched proxy and a new watched loader resumes from it with load_state_dict()),
"nodes" (torchdata.nodes: ParallelMapper threads over the samples, Batcher, Loader),
"litdata" (litdata StreamingDataLoader over shards litdata.optimize wrote to out_dir),
"hf_streaming" (Hugging Face datasets, load_dataset(streaming=True) of local JSON files,
one a worker, mapped by a slow function, in a DataLoader).
"""
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from slow_data import SlowSamples, compute, linger

import stallscope


def _step(batch, cfg):
    compute(cfg["compute_s"])


class SlowIndexed(SlowSamples):
    """The sample and its index: which samples a resumed loader serves."""

    def __getitem__(self, i):
        return super().__getitem__(i)[0], torch.tensor(i)


def stateful(cfg):
    from torchdata.stateful_dataloader import StatefulDataLoader

    n = cfg["batches"] * cfg["batch"]

    def make():
        return StatefulDataLoader(SlowIndexed(n, cfg["sample_s"]), batch_size=cfg["batch"],
                                  num_workers=cfg["workers"])

    loader = stallscope.watch(make())
    half, seen = cfg["batches"] // 2, []
    for k, (x, index) in enumerate(loader):
        _step(x, cfg)
        seen.append(int(index[0]))
        if k + 1 == half:
            state = loader.state_dict()  # through the watched proxy
            break
    resumed = stallscope.watch(make())
    resumed.load_state_dict(state)
    for x, index in resumed:
        _step(x, cfg)
        seen.append(int(index[0]))
    return {"first_indices": seen, "half": half}


def nodes(cfg):
    from torchdata import nodes as tn

    def slow(i):
        time.sleep(cfg["sample_s"])
        return torch.full((4,), float(i % 7))

    n = cfg["batches"] * cfg["batch"]
    graph = tn.Batcher(tn.ParallelMapper(tn.IterableWrapper(range(n)), slow,
                                         num_workers=cfg["workers"], method="thread"),
                       batch_size=cfg["batch"])
    batches = 0
    for x in stallscope.watch(tn.Loader(graph)):
        _step(x, cfg)
        batches += 1
    return {"batches": batches}


def litdata_loader(cfg):
    import litdata

    out_dir = cfg["out"] + "-shards"
    n = cfg["batches"] * cfg["batch"]
    if not os.path.isdir(out_dir):
        litdata.optimize(fn=_sample, inputs=list(range(n)), output_dir=out_dir,
                         chunk_bytes="64KB", num_workers=1, mode="overwrite")

    loader = litdata.StreamingDataLoader(SlowStreaming(out_dir, cfg["sample_s"]), batch_size=cfg["batch"],
                                         num_workers=cfg["workers"])
    batches = 0
    for x in stallscope.watch(loader):
        _step(x, cfg)
        batches += 1
    return {"batches": batches}


try:  # at the top level: litdata starts its workers by spawn, which pickles the class by name
    import litdata

    class SlowStreaming(litdata.StreamingDataset):
        def __init__(self, input_dir, sample_s):
            super().__init__(input_dir)
            self.sample_s = sample_s

        def __getitem__(self, index):
            time.sleep(self.sample_s)
            return super().__getitem__(index)
except ImportError:
    pass


def _sample(i):
    return {"x": torch.full((4,), float(i % 7)), "i": i}


def hf_streaming(cfg):
    import datasets
    from torch.utils.data import DataLoader

    n = cfg["batches"] * cfg["batch"]
    files = []
    for shard in range(cfg["workers"]):  # one file a worker: a streaming dataset's shards
        path = "%s-%d.jsonl" % (cfg["out"], shard)
        with open(path, "w") as f:
            for i in range(shard, n, cfg["workers"]):
                f.write(json.dumps({"x": [float(i % 7)] * 4}) + "\n")
        files.append(path)

    def slow(row):
        time.sleep(cfg["sample_s"])
        return row

    ds = datasets.load_dataset("json", data_files=files, split="train", streaming=True)
    ds = ds.map(slow).with_format("torch")
    assert ds.num_shards == cfg["workers"], ds.num_shards
    batches = 0
    for batch in stallscope.watch(DataLoader(ds, batch_size=cfg["batch"], num_workers=cfg["workers"])):
        _step(batch["x"], cfg)
        batches += 1
    return {"batches": batches}


LOADERS = {"stateful": stateful, "nodes": nodes, "litdata": litdata_loader, "hf_streaming": hf_streaming}


def main():
    cfg = json.loads(sys.argv[1])
    result = LOADERS[cfg["loader"]](cfg)
    with open(cfg["out"] + ".json", "w") as f:
        json.dump(result, f)
    linger(cfg)


if __name__ == "__main__":
    main()
