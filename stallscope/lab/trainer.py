"""One rank of a lab training job: ``python -m stallscope.lab.trainer PLAN.json``.

The one instrumented trainer of the project: the lab's scenarios, the demo, the live
mixin and correlator tests and the recorded evaluation traces all run it (lab/job.py
writes the plans). A small but real synchronous data-parallel job: ``torch.distributed``
with the gloo backend, a tiny model whose gradients are all-reduced every step (so the
slowest rank's loader sets everyone's pace, as in DDP), and a
``torch.utils.data.DataLoader`` with worker processes, wrapped by ``stallscope.watch``
(identity from the environment: STALLSCOPE_JOB, RANK, POD_NAME ...). The "GPU step" is a
sleep of ``compute_s`` after forward/backward: on a real node the CPU waits on a CUDA
sync while the GPU computes, and the agent's simulated GPU counts that span as busy.

The plan (JSON):

- ``rank``, ``world_size``, ``master`` (host:port of the gloo rendezvous; a world of
  one rank trains alone, without a process group), ``max_s``
- loader: ``workers``, ``batch_size``, ``prefetch_factor``, ``in_order``, ``pin_memory``,
  ``sharing_strategy`` (torch.multiprocessing's: ``file_descriptor``, torch's default on
  Linux, or ``file_system``),
  ``persistent_workers`` (default true); with ``epoch_batches`` N an epoch is N batches
  and the loop starts a new iterator after each (without persistent workers, each epoch
  forks its workers again); ``worker_start_s``: what each worker spends getting ready
  before its first sample (imports, opening the dataset), at every start
- per sample: a read from ``source`` (sources.py; ``reads_per_sample`` reads),
  ``sample_cpu_s`` of thread CPU time, ``sample_sleep_s`` of waiting (or, with
  ``sample_sleep_file``, the seconds written in that file, read again every 0.2 s: a
  stall that starts and ends mid-run; with ``heavy_batch_every`` N, one batch in N, drawn
  at random (a fixed draw per batch index), has samples that wait ``heavy_sleep_s``
  instead: a per-sample cost that varies widely), then,
  with ``sample_pace_s``, a wait for the worker's next slot (each worker delivers at
  most one sample per ``sample_pace_s``, as through a stream with a per-connection rate
  cap: a worker that fell behind makes up a sleep's overrun, never a burst after sitting
  idle); with ``slow_worker_sleep_s``, the worker whose id is ``slow_worker_id`` waits
  that much more per sample (one slow worker among the others), and a tensor of
  ``sample_bytes`` (or, with
  ``tensors_per_sample`` N, N tensors that share them: N shared-memory file descriptors a
  batch for the training process to take over, a transfer cost); per batch, with
  ``batch_unpickle_s``, a record that takes that long to unpickle in the training
  process (lab/handover.py: a fixed transfer cost), or with ``batch_unpickle_cpu_s``
  one that spends that much CPU time doing it (a cost a CPU limit on the training
  process stretches)
- per step: ``compute_s``; with ``compute_overlaps_cpu`` the step's CPU work (forward,
  backward, all_reduce, optimizer) runs while the simulated GPU computes, as it does
  when a real GPU runs ahead of the CPU: the step takes ``compute_s`` from the batch's
  arrival (more only when the CPU work is longer), however long the CPU work took on a
  busy machine
- epochs: ``epoch_batches`` (an epoch of that many batches, then a new iterator),
  ``persistent_workers`` (default true; false re-forks the workers every epoch),
  ``worker_start_s`` (each worker's start-up cost, slept in its worker_init_fn)
- ``trainer_cgroup``: the training process joins that cgroup after its first batch (a
  CFS quota that throttles it, not the workers it forked before)
- loader workers: ``worker_cgroup`` (each joins that cgroup as it starts: a CFS quota
  throttles only them), ``worker_cpus`` (their CPU affinity), ``shm_retry_s`` (a collate
  that retries while /dev/shm is full); what each keeps per sample until the kernel
  kills it (growth.py): ``worker_shm_cache_bytes`` in /dev/shm (a SIGBUS once it is full),
  ``worker_leak_bytes`` in its heap (an OOM kill at the pod's memory limit)
- ``restart_on_worker_death``: when a worker dies, the DataLoader raises "DataLoader
  worker (pid N) is killed by signal: ..." (from its SIGCHLD handler, wherever the loop
  is); the rank drops the broken iterator and starts a new one, as a job that restarts
  its loader does, instead of stopping. One all_reduce a step (the gradients flattened),
  so an error raised mid-step never leaves the ranks a collective apart.

Runs until SIGTERM or ``max_s``; exits 0 when stopped, whatever the other ranks did by
then. When a peer dies mid-step the collective fails; the rank then stops stepping and
waits to be stopped, as a rank blocked in an NCCL collective does, so its hook still
reports while the dead peer goes silent.
"""
import json
import os
import signal
import sys
import time

from .dataset import FEATURES, lab_dataset, retrying_collate, worker_init

_stop = False


def _on_term(signum, frame):
    global _stop
    if _stop:  # a second signal: the runner is escalating, do not linger
        os._exit(0)
    _stop = True


def _epochs(loader, done):
    """The loader's batches, epoch after epoch, until ``done()`` (one epoch outlasts the
    run unless the plan sets ``epoch_batches``)."""
    while not done():
        yield from loader


def _step(model, opt, batch, world, compute_s, overlap):
    import torch
    import torch.distributed as dist

    arrived = time.monotonic()
    if isinstance(batch, (list, tuple)):  # tensors_per_sample: one per part
        batch = torch.cat(batch, 1)
    opt.zero_grad()
    model(batch[:, :FEATURES]).sum().backward()
    if not overlap:
        time.sleep(compute_s)  # the simulated GPU's kernels
    if world > 1:
        # one collective for every gradient (one slow rank holds every rank here): an
        # error raised between two would leave this rank a collective behind its peers
        grads = [p.grad for p in model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        at = 0
        for g in grads:
            g.copy_(flat[at:at + g.numel()].view_as(g))
            at += g.numel()
    opt.step()
    if overlap:  # the kernels queued at the batch's arrival end compute_s later
        left = arrived + compute_s - time.monotonic()
        if left > 0:
            time.sleep(left)


def _join(cgroup):
    # the training process alone: the loader workers it forked stay where they are
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))


def _wait_to_be_stopped(deadline):
    while not _stop and time.monotonic() < deadline:
        time.sleep(0.2)


def main(argv):
    with open(argv[0]) as f:
        plan = json.load(f)
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    import stallscope

    from . import survive

    torch.set_num_threads(1)  # ranks share a few cores with their workers
    torch.manual_seed(0)
    if plan.get("sharing_strategy"):
        torch.multiprocessing.set_sharing_strategy(plan["sharing_strategy"])
    rank, world = plan["rank"], plan["world_size"]
    if world > 1:
        dist.init_process_group("gloo", init_method="tcp://%s" % plan["master"], rank=rank,
                                world_size=world)
    workers = plan.get("workers", 2)
    kw = {}
    if workers:
        kw = dict(persistent_workers=plan.get("persistent_workers", True),
                  prefetch_factor=plan.get("prefetch_factor", 2), multiprocessing_context="fork")
        if plan.get("worker_cgroup") or plan.get("worker_cpus") or plan.get("worker_start_s"):
            kw["worker_init_fn"] = worker_init(plan.get("worker_cgroup"), plan.get("worker_cpus"),
                                                plan.get("worker_start_s", 0.0))
        if plan.get("shm_retry_s"):
            kw["collate_fn"] = retrying_collate(plan["shm_retry_s"])
        if plan.get("batch_unpickle_s") or plan.get("batch_unpickle_cpu_s"):
            from torch.utils.data import default_collate

            from .handover import with_cost
            on_cpu = bool(plan.get("batch_unpickle_cpu_s"))
            cost = plan["batch_unpickle_cpu_s" if on_cpu else "batch_unpickle_s"]
            kw["collate_fn"] = with_cost(kw.get("collate_fn", default_collate), cost, on_cpu)
        if plan.get("in_order") is False:
            kw["in_order"] = False  # torch >= 2.6
    if plan.get("pin_memory"):
        kw["pin_memory"] = True  # without an accelerator torch warns and does not pin
    dl = DataLoader(lab_dataset(plan), batch_size=plan.get("batch_size", 8), num_workers=workers, **kw)
    loader = stallscope.watch(dl)
    # The same model on every rank whatever its sample size: the all_reduce needs it.
    model = torch.nn.Linear(FEATURES, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    compute_s = plan.get("compute_s", 0.05)
    overlap = plan.get("compute_overlaps_cpu", False)
    deadline = time.monotonic() + plan.get("max_s", 600)
    steps = 0
    print("lab rank %d/%d: pid %d, %d workers, compute %.0f ms" % (
        rank, world, os.getpid(), workers, compute_s * 1000), flush=True)
    if world > 1:
        # Every rank starts its loader together (DDP's constructor is such a sync point:
        # it broadcasts rank 0's parameters), so no rank's prefetch queue fills while it
        # waits in the first all_reduce for a peer that started late.
        dist.barrier()
    done = lambda: _stop or time.monotonic() > deadline  # noqa: E731
    unpickled = bool((plan.get("batch_unpickle_s") or plan.get("batch_unpickle_cpu_s")) and workers)
    restarts = 0
    try:
        while not done():
            try:
                for batch in _epochs(loader, done):
                    if unpickled:
                        batch = batch[0]  # the record paid its cost as it was unpickled
                    _step(model, opt, batch, world, compute_s, overlap)
                    steps += 1
                    if steps == 1 and plan.get("trainer_cgroup"):
                        _join(plan["trainer_cgroup"])
                    if done():
                        break
            except RuntimeError as e:
                if not (plan.get("restart_on_worker_death") and survive.worker_died(e)):
                    raise
                restarts += 1
                # Logged once the broken iterator is gone, so its workers' exits are read
                # (loop.py's finalizer) before the line that names the death is written.
                survive.drop_iterator(dl)
                print("lab rank %d: %s; restarting the loader (%d)" % (
                    rank, str(e).strip().splitlines()[0], restarts), flush=True)
    except Exception as e:  # a peer that stopped first breaks the collective
        if not _stop:
            print("lab rank %d: stopped stepping, %s: %s" % (rank, type(e).__name__, e), flush=True)
            _wait_to_be_stopped(deadline)
    print("lab rank %d: %d steps" % (rank, steps), flush=True)
    # Skip process-group teardown: peers may be gone, and gloo's destructor can block.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
