"""Talking to a real agent process: a raw message on its hook socket, a version-1 report,
and one value from its /metrics text."""
import json
import os
import socket


def send(path, payload):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    s.send(payload if isinstance(payload, bytes) else json.dumps(payload).encode())
    return s


def report(rank=0, events=(), job="j", pod="p"):
    return {"v": 1, "kind": "report", "pid": os.getpid(), "role": "main", "dropped_total": 0,
            "id": {"job": job, "rank": rank, "pod": pod, "namespace": "ns", "node": "n"},
            "events": [list(e) for e in events]}


def metric(text, name, **labels):
    """The value of the first sample called ``name`` whose labels include ``labels``, or None."""
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if all('%s="%s"' % kv in line for kv in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    return None
