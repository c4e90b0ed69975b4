"""Which of the hook's DataLoader introspections work with the torch this Python has
(`make test-compat` runs it in each torch's venv; issue 34): a real agent on a private
socket, a real DataLoader with 2 worker processes watched by stallscope.watch, then what
reached the agent. Prints one JSON line:

- settings: the loader's settings (num_workers, batch_size, prefetch_factor,
  pin_memory) in the agent's /api/v1/ranks entry, equal to the loader's;
- worker_pids: the 2 workers' PIDs, equal to the PIDs the workers report themselves;
- split: batches whose wait came split into ready-wait and transfer
  (``_worker_result_queue._poll``), with pin_memory False and True (``pin_thread``:
  whether torch ran its pin-memory thread; without an accelerator it does not, and the
  pin_memory=True row is the plain path again: tests/hook/test_transfer.py fakes one);
- errors: anything the hook raised into the loop (must be none), warnings it gave.

Exit status 0 when the loop ran and every batch reached the agent, whatever degraded
(a degraded introspection is reported, not failed: the table says which); 1 otherwise.
"""
import json
import os
import sys
import time
import warnings

BATCHES = 24


def _worker_pid(_):
    return os.getpid()


def run(agent, pin_memory, job):
    import torch
    from torch.utils.data import DataLoader, Dataset

    import stallscope

    class Samples(Dataset):
        def __len__(self):
            return BATCHES * 4

        def __getitem__(self, i):
            time.sleep(0.004)
            return torch.full((8,), float(i)), os.getpid()

    loader = DataLoader(Samples(), batch_size=4, num_workers=2, prefetch_factor=3,
                        pin_memory=pin_memory)
    pids, errors, pin_thread = set(), [], None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            it = iter(stallscope.watch(loader, job=job, rank=0))
            pin_thread = getattr(it, "_pin_memory", None)  # torch pins only with an accelerator
            for _, pid in it:
                pids.update(int(p) for p in pid)
                time.sleep(0.01)
        except Exception as e:  # the probe reports whatever the hook raised
            errors.append("%s: %s" % (type(e).__name__, e))
    return pids, errors, [str(w.message) for w in caught], pin_thread


def entry(agent, job, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for r in agent.api("/api/v1/ranks").get("ranks") or []:
            if r.get("job") == job and r.get("batches", 0) >= BATCHES:
                return r
        time.sleep(0.25)
    return None


def main():
    import torch

    from stallscope.processes.servers import AgentProcess

    agent = AgentProcess().start()
    os.environ["STALLSCOPE_SOCKET"] = agent.socket  # before the hook's first look
    out = {"torch": torch.__version__, "python": "%d.%d.%d" % sys.version_info[:3]}
    ok = True
    try:
        for pin in (False, True):
            job = "compat-pin" if pin else "compat"
            pids, errors, notes, pin_thread = run(agent, pin, job)
            r = entry(agent, job)
            key = "pin_memory" if pin else "plain"
            if r is None:
                out[key] = {"reached_agent": False, "errors": errors, "warnings": notes}
                ok = False
                continue
            tl = agent.api("/api/v1/timeline?rank=0&job=%s&seconds=600" % job)
            split = sum(1 for b in tl.get("batches") or [] if b.get("ready_wait_ns", -1) >= 0)
            loader = r.get("loader") or {}
            out[key] = {
                "reached_agent": True, "batches": r["batches"],
                "settings": loader.get("num_workers") == 2 and loader.get("batch_size") == 4
                and loader.get("prefetch_factor") == 3 and loader.get("pin_memory") == pin,
                "loader": loader,
                "worker_pids": sorted(r.get("worker_pids") or []) == sorted(pids) and len(pids) == 2,
                "split_batches": split, "split": split >= BATCHES - 1, "pin_thread": pin_thread,
                "errors": errors, "warnings": notes}
            ok = ok and not errors
    finally:
        agent.stop()
    print(json.dumps(out, sort_keys=True))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
