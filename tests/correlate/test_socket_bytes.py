"""The bytes a batch of a loader whose workers read over sockets (issue 49): the
kernel's rchar (/proc/<pid>/io) does not count a socket's recv(), so the drawn
bandwidth-bound runs read 4e-05 MB a batch by their workers' reads for the 1 MB their
samples are. Judged against what each recorded draw injected: its samples' bytes a
batch and the link's shaped rate."""
import glob
import os

import pytest

from stallscope.correlate import measured
from stallscope.correlate.trace import RankTrace
from stallscope.lab import draws
from tests.helpers import ROOT

DRAWS = sorted(glob.glob(os.path.join(ROOT, "tests", "data", "draws", "draw-*-bandwidth-bound.json.gz")))


def _target(doc):
    rank = str(doc["expected"]["rank"])
    body = next(b for b in doc["timelines"] if str((b.get("rank") or {}).get("rank")) == rank)
    return RankTrace.from_timeline(body)


@pytest.mark.parametrize("path", DRAWS, ids=[os.path.basename(p)[5:8] for p in DRAWS])
def test_a_socket_reader_s_bytes_a_batch_are_its_samples_not_its_rchar(path):
    doc = draws.read(path)
    draw = doc["draw"]
    (_, fault), = [f for f in draw["fault"] if f[0] == "ShapedStore"]
    injected = draw["everyone"]["batch_size"] * fault["read_kib"] * 1024
    trace = _target(doc)
    link = measured.link(trace)
    assert link is not None, "no link measured"
    # the link carried the target's reads and nothing else the lab sends: within the
    # link's own measurement error (its rate over ~25 one-second samples)
    assert link.bytes_per_batch == pytest.approx(injected, rel=0.1)
    assert link.rank_bytes_per_second <= fault["rate"] * 1.05
    found = measured.read_rate(trace)
    assert found is not None and "sockets" in found[1]
