"""The wrapper behaves like the wrapped iterable and records one event per batch."""
import os
import subprocess
import sys
import warnings

import pytest

import stallscope
from stallscope.hook import channel
from stallscope.hook import stream as hook_stream


def _detach(wrapped_iter):
    """Take the iterator's stream away from the process's flush thread, so the test
    alone drains it."""
    stream = wrapped_iter._stream
    ch = channel.get()
    with ch.lock:
        if stream in ch.streams:
            ch.streams.remove(stream)
    return stream


def _stream_events(wrapped_iter):
    """Events the iterator recorded, built the way the channel builds them."""
    ch = channel.Channel(path="/nonexistent/stallscope-test.sock")
    stream = wrapped_iter._stream
    ch._drain(stream)
    return stream.pending


def test_list_semantics():
    data = [1, 2, 3]
    w = stallscope.watch(data)
    assert list(w) == [1, 2, 3]
    assert list(w) == [1, 2, 3]  # re-iterable per epoch
    assert len(w) == 3
    assert isinstance(w, list)
    assert w.count(2) == 1  # attribute reads pass through
    assert repr(w) == repr(data)


def test_generator_is_single_use_like_the_original():
    w = stallscope.watch(x * 2 for x in range(4))
    assert not hasattr(w, "__len__") or not hasattr(type(w), "__len__")
    with pytest.raises(TypeError):
        len(w)
    assert next(w) == 0
    assert list(w) == [2, 4, 6]
    assert list(w) == []


def test_attributes_and_set_epoch_pass_through():
    class Loader:
        def __init__(self):
            self.epoch = None
            self.items = [10, 20]

        def __iter__(self):
            return iter(self.items)

        def set_epoch(self, e):
            self.epoch = e

    orig = Loader()
    w = stallscope.watch(orig)
    w.set_epoch(3)
    assert orig.epoch == 3
    w.items = [7]
    assert orig.items == [7] and list(w) == [7]
    with pytest.raises(TypeError):
        len(w)  # the original has no len; neither does the wrapper


def test_idempotent_and_reversible():
    data = [1]
    w = stallscope.watch(data)
    assert stallscope.watch(w) is w
    assert stallscope.unwatch(w) is data
    assert stallscope.unwatch(data) is data


def test_loader_exceptions_pass_through_unchanged():
    def gen():
        yield 1
        raise KeyError("boom")

    w = stallscope.watch(gen())
    it = iter(w)
    assert next(it) == 1
    with pytest.raises(KeyError, match="boom"):
        next(it)


def test_unknown_keyword_warns_and_does_not_raise():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w = stallscope.watch([1], rnak=3)
    assert list(w) == [1]
    assert any("rnak" in str(c.message) for c in caught)


def test_disable_env_returns_original(monkeypatch):
    monkeypatch.setenv("STALLSCOPE_DISABLE", "1")
    data = [1]
    assert stallscope.watch(data) is data


def test_one_event_per_batch_with_wait_and_interval():
    w = stallscope.watch(range(5))
    it = iter(w)
    _detach(it)
    for _ in it:
        pass
    events = _stream_events(it)
    assert len(events) == 5
    ends = [e[0] for e in events]
    assert ends == sorted(ends)
    assert events[0][2] == events[0][1]  # first batch: interval is its wait
    for prev, ev in zip(events, events[1:]):
        assert ev[2] == ev[0] - prev[0]  # interval = time since the previous batch
        assert 0 <= ev[1] <= ev[2]


def test_overrides_reach_the_identity(monkeypatch):
    monkeypatch.setenv("RANK", "5")
    w = stallscope.watch([1], job="j1", rank=2, node="n1")
    ident = object.__getattribute__(w, "_ss_ident")
    assert (ident["job"], ident["rank"], ident["node"]) == ("j1", 2, "n1")


def test_no_agent_counts_drops_and_never_raises(tmp_path):
    ch = channel.Channel(path=str(tmp_path / "absent.sock"))
    stream = channel.Stream({"job": "j", "rank": 0}, owner=None)
    stream.buf.extend([1, 2, 3, 5])
    ch.streams.append(stream)
    ch.flush()
    assert ch.dropped == 2 and stream.pending == []


def test_pending_is_bounded_when_undeliverable(tmp_path, monkeypatch):
    monkeypatch.setattr(hook_stream, "MAX_PENDING", 10)
    ch = channel.Channel(path=str(tmp_path / "absent.sock"))
    stream = channel.Stream({"job": "j", "rank": 0})
    stream.buf.extend(range(2 * 25))
    ch._drain(stream)
    assert len(stream.pending) == 10 and ch.dropped == 15


def test_dataloader_batches_identical_and_isinstance():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    ds = TensorDataset(torch.arange(40).float())
    plain = DataLoader(ds, batch_size=4, num_workers=2, shuffle=False)
    watched = stallscope.watch(DataLoader(ds, batch_size=4, num_workers=2, shuffle=False))
    assert isinstance(watched, DataLoader)
    assert len(watched) == len(plain) == 10
    for _ in range(2):  # two epochs
        a = [b[0].tolist() for b in plain]
        b = [b[0].tolist() for b in watched]
        assert a == b


def test_a_batch_sampler_loader_reports_the_samplers_batch_size():
    """issue 52: Hugging Face runs showed batch_size=None (their loaders batch by a
    batch_sampler, and DataLoader.batch_size is then None)."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset

    data = TensorDataset(torch.arange(12).float())
    dl = DataLoader(data, batch_sampler=BatchSampler(SequentialSampler(data), 3, False))
    assert dl.batch_size is None
    it = iter(stallscope.watch(dl))
    assert it._stream.loader["batch_size"] == 3
    assert [len(b[0]) for b in it] == [3, 3, 3, 3]


def test_dataloader_loader_info_and_worker_pids():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    dl = DataLoader(TensorDataset(torch.arange(8).float()), batch_size=2, num_workers=2,
                    persistent_workers=True)
    w = stallscope.watch(dl)
    it = iter(w)
    info = it._stream.loader
    assert info["num_workers"] == 2 and info["batch_size"] == 2
    assert info["prefetch_factor"] == 2 and info["persistent_workers"] is True
    assert info["pin_memory"] is False
    assert sorted(info["worker_pids"]) == sorted(p.pid for p in it._workers)
    assert all(p != os.getpid() for p in info["worker_pids"])
    list(it)


def test_import_loads_only_the_standard_library():
    code = ("import sys; before = set(sys.modules); import stallscope; "
            "print(' '.join(sorted(set(sys.modules) - before)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(out.split())
    # Standard library only, and not even its HTTP stack.
    assert all(m.split(".")[0] in sys.stdlib_module_names or m.startswith("stallscope")
               for m in loaded), sorted(loaded)
    assert not {m for m in loaded if m.split(".")[0] in {"http", "urllib", "email", "ssl"}}, sorted(loaded)
    # only the hook of stallscope (and the report cadences it sends by): not the vocabulary's
    # every metric, signal and cause, ~20 ms of a trainer's import (issue 50)
    ours = {m for m in loaded if m.startswith("stallscope")}
    hook = {m for m in ours if m.startswith("stallscope.hook")}
    assert ours <= {"stallscope", "stallscope.cadence"} | hook, sorted(ours)


def test_blocked_in_next_is_visible_to_the_flush_and_pairs_stay_aligned():
    import threading
    import time

    release = threading.Event()

    class Flaky:
        """Yields 1, raises once (the caller catches it), then blocks, then yields 2."""
        def __init__(self):
            self.calls = 0

        def __iter__(self):
            return self

        def __next__(self):
            self.calls += 1
            if self.calls == 2:
                raise ValueError("transient")
            if self.calls == 3:
                release.wait(10)
                return 2
            if self.calls > 3:
                raise StopIteration
            return 1

    it = iter(stallscope.watch(Flaky()))
    ch = channel.Channel(path="/nonexistent/stallscope-test.sock")
    stream = _detach(it)
    assert next(it) == 1
    with pytest.raises(ValueError):
        next(it)
    assert len(stream.buf) == 2  # the failed call left no dangling start
    box = []
    t = threading.Thread(target=lambda: box.append(next(it)))
    t.start()
    time.sleep(0.2)
    before = time.perf_counter_ns()
    ch._drain(stream)
    assert stream.blocked_since is not None and stream.blocked_since < before
    assert len(stream.pending) == 1  # the first batch; the blocked one is not an event yet
    release.set()
    t.join()
    assert box == [2]
    ch._drain(stream)
    assert stream.blocked_since is None
    assert len(stream.pending) == 2
    assert stream.pending[1][1] >= 0.2e9  # its wait covers the blocked time
    assert list(it) == []
    assert stream.buf == []


def test_the_drain_by_big_int_fields_gives_the_columns_of_the_lists_way():
    # Issue 50: drain() turns the loop's times into the columns as big ints of 64-bit
    # fields (wire.py extend_times), no Python int a value; a split stream's waits take
    # the lists' way (_drain_lists). Both give the same events, sums, blocked start and
    # leftover, for any times: a first batch, one after an earlier drain, a wait of 0 or
    # 1 ns, times that go back (no clock gives them; no borrow may cross a field), an
    # unpaired start left in the buffer, and columns longer than the bias kept.
    import random

    rng = random.Random(50)
    sizes = [0, 1, 2, 255, 256, 257, channel.wire.BIAS_KEPT, channel.wire.BIAS_KEPT + 3]
    for trial in range(120):
        fast, lists = channel.Stream({"job": "j"}), channel.Stream({"job": "j"})
        t = rng.randrange(1 << 50)
        for _ in range(3):
            k = sizes[trial] if trial < len(sizes) else rng.randrange(0, 60)
            times = []
            for _ in range(k):
                start = t + rng.randrange(10 ** 6)
                end = start + rng.choice((0, 1, rng.randrange(10 ** 9)))
                if trial % 7 == 0:
                    end = start - rng.randrange(2000)
                times += [start, end]
                t = max(start, end)
            if rng.random() < 0.5:
                times.append(t + 5)  # a next() in progress
            fast.buf[:] = times
            lists.buf[:] = list(times)
            assert fast.drain() == lists._drain_lists()  # dropped past MAX_PENDING alike
            assert list(fast.pending) == list(lists.pending), trial
            assert (fast.pending.wait_sum, fast.pending.interval_sum) == \
                (lists.pending.wait_sum, lists.pending.interval_sum)
            assert (fast.buf, fast.blocked_since, fast.prev_end) == \
                (lists.buf, lists.blocked_since, lists.prev_end)
            fast.pending.drop_first(len(fast.pending))
            lists.pending.drop_first(len(lists.pending))


def test_a_worker_death_raised_outside_next_still_reports_its_exit():
    """torch raises a worker's death from its SIGCHLD handler wherever the main thread is
    (here: in the step's sleep, not in next()); the exit code still reaches the report
    once the iterator goes, read without reaping the zombie torch checks itself."""
    import signal
    import time

    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    dl = DataLoader(range(10 ** 6), batch_size=2, num_workers=2, multiprocessing_context="fork")
    it = iter(stallscope.watch(dl))
    stream = _detach(it)
    next(it)
    victim = it._workers[1].pid
    with pytest.raises(RuntimeError, match="killed by signal"):
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the step: the loop is not in next()
            time.sleep(0.05)
    assert stream.loader.get("worker_exits") is None  # next() never saw the error
    it._shutdown_workers()
    del it  # the error unwound the loop that held the iterator
    assert [victim, -signal.SIGKILL] in stream.loader["worker_exits"], stream.loader


def test_exit_codes_are_read_without_reaping():
    """exit_code leaves a dead worker a zombie (waitid WNOWAIT), as torch's check needs."""
    import multiprocessing
    import signal
    import time

    from stallscope.hook import exits
    p = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
    p.start()
    assert exits.exit_code(p) is None  # running
    os.kill(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while exits.exit_code(p) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert exits.exit_code(p) == -signal.SIGTERM
    with open("/proc/%d/stat" % p.pid) as f:
        assert f.read().rsplit(")", 1)[1].split()[0] == "Z"  # still there to be reaped
    p.join(5)
    assert p.exitcode == -signal.SIGTERM and exits.exit_code(p) == -signal.SIGTERM


def test_a_worker_reports_every_worker_flush_unless_its_load_time_moves(tmp_path, monkeypatch):
    """Issue 15: a worker's batches go every WORKER_FLUSH_S once its first few reports
    have gone (1, 2, 4, 8 s apart), and at the next flush when their mean load time moved
    by MOVED since its last report (a loader that slows is
    news for the cause of a stall the detector names in seconds)."""
    import socket

    path = str(tmp_path / "agent.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    srv.bind(path)
    srv.listen(4)
    clock = [1000.0]
    monkeypatch.setattr(channel.time, "monotonic", lambda: clock[0])
    ch = channel.Channel(path=path)
    stream = channel.Stream({"job": "j", "rank": 0}, role="worker")
    ch.streams.append(stream)
    t = [10**12]
    conn = []

    def second(load_ms):
        """One second of a worker making a batch every 100 ms, then a flush: the number
        of reports the agent got."""
        for _ in range(10):
            stream.buf.extend([t[0], t[0] + int(load_ms * 10**6)])
            t[0] += 100 * 10**6
        clock[0] += 1.0
        ch.flush()
        if not conn:
            conn.append(srv.accept()[0])
            conn[0].setblocking(False)
        got = 0
        while True:
            try:
                conn[0].recv(70000)
            except BlockingIOError:
                return got
            got += 1

    try:
        every = int(channel.WORKER_FLUSH_S)
        quiet = [0] * (every - 1)
        # the first at once, then 1, 2, 4 and 8 s apart (channel.worker_gap) ...
        assert [second(50) for _ in range(16)] == [1, 1, 0, 1, 0, 0, 0, 1] + [0] * 7 + [1]
        assert [channel.worker_gap(k) for k in range(1, 7)] == [1, 2, 4, 8, every, every]
        # ... then every WORKER_FLUSH_S (16 s)
        assert [second(50) for _ in range(2 * every)] == quiet + [1] + quiet + [1]
        assert second(50 * hook_stream.MOVED * 1.2) == 1  # slower by more than MOVED: at once
        assert [second(50 * hook_stream.MOVED * 1.2) for _ in range(every)] == quiet + [1]  # the new level
        assert second(50) == 1  # back: at once too
        assert [second(50 * 1.3) for _ in range(every)] == quiet + [1]  # under MOVED: no news
    finally:
        srv.close()
        for c in conn:
            c.close()


class _OwnLoader:
    """A loader of its own kind (not a DataLoader): what the hook cannot look into."""

    def __iter__(self):
        return iter([1, 2])


def test_a_trainer_reports_every_trainer_flush_while_its_wait_holds_steady(tmp_path, monkeypatch):
    """Issue 31: a trainer's batches go at each of its first flushes, then every
    TRAINER_FLUSH_S while its wait share holds, and at the next flush when the share
    moved (a stall that begins or ends) or a next() has been blocked BLOCKED_REPORT_S;
    a short next() in progress at a flush is no news."""
    import socket

    path = str(tmp_path / "agent.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    srv.bind(path)
    srv.listen(4)
    clock = [1000.0]
    t = [10**12]  # the loop's clock (perf_counter_ns), ns
    monkeypatch.setattr(channel.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(channel.time, "perf_counter_ns", lambda: t[0])
    ch = channel.Channel(path=path)
    stream = channel.Stream({"job": "j", "rank": 0}, role="main")
    ch.streams.append(stream)
    conn = []

    def second(wait_share, inside=0.0):
        """One second of a loop taking a batch every 100 ms, waiting ``wait_share`` of
        it in next(), then a flush while a next() call has lasted ``inside`` seconds
        (it ends after the flush): the number of reports the agent got."""
        for _ in range(10):
            t[0] += int(100 * 10**6 * (1 - wait_share))
            stream.buf.extend([t[0], t[0] + int(100 * 10**6 * wait_share)])
            t[0] += int(100 * 10**6 * wait_share)
        if inside:
            stream.buf.append(t[0])
            t[0] += int(inside * 1e9)
        clock[0] += 1.0
        ch.flush()
        if inside:
            stream.buf.append(t[0])  # the call ends: a batch
        if not conn:
            conn.append(srv.accept()[0])
            conn[0].setblocking(False)
        got = 0
        while True:
            try:
                conn[0].recv(70000)
            except BlockingIOError:
                return got
            got += 1

    try:
        every = int(channel.TRAINER_FLUSH_S)
        quiet = [0] * (every - 1)
        prompt = channel.TRAINER_PROMPT_REPORTS
        assert [second(0.02) for _ in range(prompt)] == [1] * prompt  # its start: each flush
        assert [second(0.02) for _ in range(2 * every)] == (quiet + [1]) * 2  # steady
        assert [second(0.02, inside=0.01) for _ in range(every)] == quiet + [1]  # short calls: no news
        second(0.02)
        blocked = channel.BLOCKED_REPORT_S * 1.5
        assert second(0.02, inside=blocked) == 1  # a call blocked past BLOCKED_REPORT_S: at once
        assert second(0.02) == 1  # the long batch: a share that moved
        assert second(0.02) == 1  # and back
        assert [second(0.02) for _ in range(every)] == quiet + [1]  # steady again
        assert second(0.02 + 2 * hook_stream.SHARE_MOVED_ABS) == 1  # a stall begins: at once
        assert [second(0.12) for _ in range(every)] == quiet + [1]  # the new level holds
        assert second(0.12 + hook_stream.SHARE_MOVED_ABS / 2) == 0  # within the noise
        second(0.12)
        assert second(0.02) == 1  # it ends: at once too
    finally:
        srv.close()
        for c in conn:
            c.close()


def test_a_trainers_wait_share_moves_by_its_absolute_or_relative_bound():
    s = channel.Stream({"job": "j", "rank": 0}, role="main")
    assert hook_stream.share_moved(s)  # nothing sent yet: news
    s.sent_share = 0.6
    s.pending.extend([1, 2], [55, 55], [100, 100])  # 0.55: within 0.25 x 0.6
    assert not hook_stream.share_moved(s)
    s.pending = channel.wire.Columns()
    s.pending.extend([1], [40], [100])  # 0.40: past it
    assert hook_stream.share_moved(s)
    s.sent_share = 0.0
    s.pending = channel.wire.Columns()
    s.pending.extend([1], [4], [100])  # 0.04: within SHARE_MOVED_ABS
    assert not hook_stream.share_moved(s)
    assert hook_stream.wait_share(s.pending) == 0.04
    assert hook_stream.wait_share(channel.wire.Columns()) is None


def test_the_cadence_decisions_read_running_sums_not_the_pending_batches():
    # Issue 50: share_moved and moved re-summed every pending batch each flush tick, so
    # a fast loop under the 2 s hold paid O(pending) a tick. The sums now run with the
    # columns: each batch added once and taken off once, whatever drops them.
    import random

    rng = random.Random(5)
    cols = channel.wire.Columns(ready=True)
    for _ in range(300):
        k = rng.randrange(1, 40)
        cols.extend([0] * k, [rng.randrange(1000) for _ in range(k)],
                    [rng.randrange(1000, 2000) for _ in range(k)])
        cols.drop_first(rng.randrange(0, len(cols) + 3))  # some, none, or past all
        assert (cols.wait_sum, cols.interval_sum) == (sum(cols.waits), sum(cols.intervals))
        n = rng.randrange(0, len(cols) + 2)
        assert cols.sums(n) == (sum(cols.waits[:n]), sum(cols.intervals[:n]))
    # the decisions read the sums: a column changed behind their back goes unseen
    s = channel.Stream({"job": "j", "rank": 0}, role="main")
    s.sent_share = 0.5
    s.pending.extend([1, 2], [50, 50], [100, 100])
    s.pending.waits[0] = 0  # not through extend(): the running sum still says 0.5
    assert hook_stream.wait_share(s.pending) == 0.5 and not hook_stream.share_moved(s)


def test_a_loader_that_is_not_a_dataloader_says_once_what_is_not_introspected():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert list(stallscope.watch(_OwnLoader())) == [1, 2]
        assert list(stallscope.watch(_OwnLoader())) == [1, 2]  # the same type: said already
        assert list(stallscope.watch([3])) == [3]              # a plain list: nothing to say
    said = [str(c.message) for c in caught if "is not a torch DataLoader" in str(c.message)]
    assert len(said) == 1, said
    assert "_OwnLoader" in said[0] and "per-batch data-wait" in said[0], said
