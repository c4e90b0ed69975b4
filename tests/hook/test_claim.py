"""watch() next to other instrumentation (hook/claim.py): when another tool wraps the
DataLoader's iterator (a generator patched over DataLoader.__iter__, TraceML's auto mode),
the worker reports, the worker PIDs and the ready/transfer split still arrive; when the
iterator cannot be found, watch() says once which evidence is lost."""
import os
import shutil
import subprocess
import sys
import warnings

import pytest
from torch.utils.data import DataLoader

import stallscope
from stallscope.processes.servers import free_port
from tests.helpers import wait_until
from tests.hook.test_batches import finish, rank_doc, run_trainer, stop


def _check_full_evidence(agent, out, rank, batches):
    r = rank_doc(agent, rank, batches)  # every batch's load time came from the workers
    assert sorted(r["worker_pids"]) == sorted(out["worker_pids"]) and len(out["worker_pids"]) == 2
    assert r["sizing"]["num_workers"] == 2
    # 4 samples x 10 ms a batch in the workers: the load times are the injected ones
    # (sleep never returns early; at a load of 30 on 2 cores, wake-ups add up to ~2x)
    assert 0.04 <= r["sizing"]["batch_load_seconds"] < 0.12, r["sizing"]
    timeline = agent.api("/api/v1/timeline?rank=%d&seconds=120" % rank)["batches"]
    assert len(timeline) == batches
    # the split of each wait survived: the time waiting for a ready batch, within the wait
    assert all(0 <= b["ready_wait_ns"] <= b["wait_ns"] for b in timeline), timeline[:2]


@pytest.mark.slow
@pytest.mark.parametrize("epochs", [1, 2])
def test_a_generator_patched_over_dataloader_iter_keeps_the_worker_reports(agent, hook_env, epochs):
    cfg = dict(workers=2, sample_s=0.01, batch=4, compute_s=0.002, batches=10, epochs=epochs,
               wrap="generator")
    proc = run_trainer(agent, hook_env, cfg, rank=epochs)
    try:
        out = finish(proc)
        assert out["batches"] == 10 * epochs
        _check_full_evidence(agent, out, epochs, out["batches"])
    finally:
        stop([proc])


@pytest.fixture
def traceml_aggregator(tmp_path):
    pytest.importorskip("traceml_ai")
    exe = shutil.which("traceml") or os.path.join(os.path.dirname(sys.executable), "traceml")
    port = free_port()
    proc = subprocess.Popen([exe, "serve", "--aggregator-port", str(port), "--mode", "summary",
                             "--logs-dir", str(tmp_path / "traceml")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import socket

    def up():
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0
    try:
        wait_until(up, timeout=30)
        yield port, str(tmp_path / "traceml")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_traceml_auto_mode_keeps_the_worker_reports(agent, hook_env, traceml_aggregator):
    port, logs = traceml_aggregator
    env = {"TRACEML_AGGREGATOR_PORT": str(port), "TRACEML_LOGS_DIR": logs}
    os.environ.update(env)  # hook_env copies os.environ
    try:
        proc = run_trainer(agent, hook_env, dict(workers=2, sample_s=0.01, batch=4, compute_s=0.002,
                                                 batches=10, wrap="traceml"), rank=7)
    finally:
        for k in env:
            del os.environ[k]
    try:
        out = finish(proc)
        _check_full_evidence(agent, out, 7, out["batches"])
    finally:
        stop([proc])


class _Hidden:
    """A loader that builds its DataLoader's iterator where no claim can see it: in
    another thread, before watch() asks."""

    def __init__(self, dl, original):
        self.dl, self.original = dl, original
        self.it = None

    def __iter__(self):
        import threading

        t = threading.Thread(target=lambda: setattr(self, "it", self.original(self.dl)))
        t.start()
        t.join()
        return (b for b in self.it)


def test_a_hidden_iterator_is_said_once_with_what_is_lost(monkeypatch, tmp_path):
    monkeypatch.setenv("STALLSCOPE_SOCKET", str(tmp_path / "nobody.sock"))
    monkeypatch.setattr(sys.modules["stallscope.hook.watch"], "_lost_said", False)
    dl = DataLoader(list(range(8)), batch_size=2, num_workers=1)
    hidden = _Hidden(dl, DataLoader.__iter__)
    monkeypatch.setattr(DataLoader, "__iter__", lambda self: _Hidden.__iter__(hidden))
    watched = stallscope.watch(dl)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        first = [b.tolist() for b in watched]
        second = [b.tolist() for b in watched]
    assert first == second == [[0, 1], [2, 3], [4, 5], [6, 7]]  # the loop is untouched
    lost = [w for w in said if "hidden behind" in str(w.message)]
    assert len(lost) == 1, [str(w.message) for w in said]
    assert "worker batch times, worker PIDs" in str(lost[0].message)
    assert "generator" in str(lost[0].message)
