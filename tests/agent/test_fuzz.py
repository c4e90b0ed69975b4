"""Fuzzing the hook socket of a real agent with a fixed seed: hostile and broken messages
of every kind, over several connections. After every batch the agent still answers,
/metrics parses and passes `promtool check metrics`, and every message sent is accounted
for (accepted + counted rejects).

The suite runs a short fuzz; `make fuzz` runs 1,000,000 messages
(STALLSCOPE_FUZZ_MESSAGES sets the count)."""
import json
import os
import random
import shutil
import socket
import subprocess
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stallscope.hook import wire
from stallscope.processes.servers import http_get

MESSAGES = int(os.environ.get("STALLSCOPE_FUZZ_MESSAGES", "6000"))
BATCH = min(MESSAGES, 20000)
SEED = 20261201
STRINGS = ["j", "", "\ud800", "a" * 200, "evil\npod", "\u200b", "ok-pod", "\x7f", "ns", "\U0001F600",
           "%s", "{{", "\\", "x" * 128]
NUMBERS = [0, 1, -1, 2**31, 2**53, 2**62, 2**63, 2**70, 1.5, float("1e308"), True, None, "1", [], {}]


def valid(rng, now):
    role = rng.choice(["main", "main", "worker"])
    n = rng.randrange(0, 40)
    end = now - rng.randrange(0, 10**11)
    events = []
    for _ in range(n):
        wait = rng.randrange(0, 10**8)
        events.append([end, wait, wait + rng.randrange(0, 10**8)])
        end += rng.randrange(1, 10**8)
    msg = {"v": 1, "kind": "report", "pid": rng.randrange(1, 4000), "role": role,
           "mono_ns": now, "wall_ns": time.time_ns(), "dropped_total": rng.randrange(0, 100),
           "id": {"job": rng.choice(["train", "eval"]), "rank": rng.randrange(0, 6),
                  "local_rank": 0, "world_size": 8, "pod": rng.choice(["p0", "p1"]),
                  "namespace": "ns", "node": ""},
           "events": events}
    if rng.random() < 0.3:
        msg["loader"] = {"num_workers": rng.randrange(0, 4), "prefetch_factor": 2,
                         "pin_memory": False, "persistent_workers": True, "batch_size": 8,
                         "worker_pids": [rng.randrange(1, 5000) for _ in range(rng.randrange(0, 4))]}
    if rng.random() < 0.3:
        msg["io"] = {"tiers": ["fuse", "local"], "reads": [[now, 10**6, 4096, rng.randrange(0, 2)]],
                     "cache": [[0, rng.randrange(0, 5), rng.randrange(0, 5)]],
                     "slowest": [[0, 10**6, "shard-%d" % rng.randrange(9)]]}
    if rng.random() < 0.1:
        msg["cuda"] = {"index": 0, "uuid": "GPU-%08x" % rng.randrange(2**32)}
    if rng.random() < 0.1:
        msg["blocked_since_ns"] = now - rng.randrange(0, 10**10)
    return msg


def mutate(rng, msg):
    """Replace one value somewhere in the message by a hostile one."""
    paths = [(msg, k) for k in msg]
    for extra in ("id", "loader", "io", "cuda"):
        if isinstance(msg.get(extra), dict):
            paths += [(msg[extra], k) for k in msg[extra]]
    events = msg.get("events")
    if isinstance(events, list):
        paths += [(ev, i) for ev in events if isinstance(ev, list) for i in range(len(ev))]
    container, key = rng.choice(paths)
    container[key] = rng.choice(STRINGS + NUMBERS + [[1, 2, 3], {"a": 1}])
    return msg


def as_v2(rng, msg):
    """``msg`` in wire version 2, with the ready-wait column (valid, or one hostile value)
    when it is a trainer's, when its events are integers."""
    from array import array

    events = msg.pop("events", None)
    head = dict(msg, v=2)
    try:
        cols = [array("q", [e[k] for e in events]) for k in range(3)]
    except (TypeError, IndexError, KeyError, OverflowError):
        return json.dumps(dict(head, events=events)).encode()
    head["n"] = len(events)
    if msg.get("role") == "main" and rng.random() < 0.8:
        ready = [rng.randrange(0, max(w, 0) + 1) for w in cols[1]]
        if ready and rng.random() < 0.3:
            ready[rng.randrange(len(ready))] = rng.choice([-1, 2**62, cols[1][0] + 1])
        cols.append(array("q", ready))
        head["cols"] = rng.choice([4] * 8 + [3, 5, "4"])
    return json.dumps(head).encode() + b"\n" + b"".join(c.tobytes() for c in cols)


def encode(rng, msg):
    if rng.random() < 0.3:
        return as_v2(rng, msg)
    data = json.dumps(msg).encode()
    r = rng.random()
    if r < 0.05:
        return b""
    if r < 0.10:
        return data[:rng.randrange(1, len(data))]                          # truncated
    if r < 0.13:
        return data.replace(b'"j"', b'"\xed\xa0\x80"') if b'"j"' in data else data + b"\x80"
    if r < 0.15:
        return b"[" * rng.randrange(1, 50000)                               # nesting
    if r < 0.16:
        return b"{" + b" " * (wire.MAX_MESSAGE_BYTES + 10) + b"}"             # oversize
    if r < 0.20:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
    return data


def messages(rng, n):
    now = time.monotonic_ns()
    for _ in range(n):
        msg = valid(rng, now)
        if rng.random() < 0.5:
            for _ in range(rng.randrange(1, 4)):
                mutate(rng, msg)
        yield encode(rng, msg)


def check_metrics(agent):
    text = http_get(agent.url + "/metrics", timeout=10)
    assert list(text_string_to_metric_families(text))
    if shutil.which("promtool"):
        out = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
    return text


def accounted(text):
    total = 0.0
    for f in text_string_to_metric_families(text):
        if f.name in ("stallscope_agent_messages", "stallscope_agent_rejected_messages"):
            total += sum(s.value for s in f.samples if s.name.endswith("_total"))
        if f.name == "stallscope_agent_held_messages":  # in flight, counted when settled
            total += sum(s.value for s in f.samples)
    return int(total)


@pytest.mark.slow
def test_fuzzed_messages_never_break_the_agent(agent_factory):
    agent = agent_factory("--max-ranks", "16", "--gpu.simulated", "--no-gpu.nvml",
                          "--exporter.interval", "0.5")
    rng = random.Random(SEED)
    conns = []
    sent = 0
    started = time.monotonic()
    while sent < MESSAGES:
        n = min(BATCH, MESSAGES - sent)
        for data in messages(rng, n):
            if not conns or rng.random() < 0.002:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                s.connect(agent.socket)
                conns.append(s)
                if len(conns) > 8:
                    conns.pop(0).close()
            conns[-1].send(data)  # blocking: nothing is lost on this side
            sent += 1
        deadline = time.monotonic() + 120
        while True:
            text = check_metrics(agent)
            if accounted(text) == sent or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert accounted(text) == sent, "sent %d, accepted + rejected %d" % (sent, accounted(text))
        assert agent.proc.poll() is None
        assert http_get(agent.url + "/healthz") == "ok\n"
    for s in conns:
        s.close()
    rejects = {s.labels["reason"]: s.value for f in text_string_to_metric_families(text)
               if f.name == "stallscope_agent_rejected_messages" for s in f.samples}
    assert "internal_error" not in rejects, rejects
    print("fuzz: %d messages in %.1fs, rejects %s" % (sent, time.monotonic() - started, rejects))
