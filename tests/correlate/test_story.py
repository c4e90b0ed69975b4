"""One report, one story (issue 49): over every recorded lab trace (every drawn scenario:
tests/lab/test_draws.py's replay), the verdict line, the causes' sentences and the
predictions do not contradict one another; the checker itself catches each kind of
contradiction it names."""
import dataclasses
import glob
import json
import os

import pytest

from stallscope.correlate import diagnosis, story
from stallscope.correlate.model import Prediction, ProposedSettings, Straggler
from stallscope.lab import evaluate
from tests.correlate.test_budget import _steady_slow_mount

ROOT = os.path.join(os.path.dirname(__file__), "..", "data")
TRACES = sorted(glob.glob(os.path.join(ROOT, "traces", "*.json")))


@pytest.mark.parametrize("path", TRACES, ids=[os.path.basename(p)[:-5] for p in TRACES])
def test_no_recorded_trace_tells_two_stories(path):
    with open(path) as f:
        d = evaluate.diagnose(json.load(f))
    assert story.contradictions(d) == []


def test_the_checker_catches_each_contradiction_it_names():
    d = diagnosis.analyse(_steady_slow_mount())
    assert story.contradictions(d) == []
    top = d.causes[0]
    assert story.contradictions(dataclasses.replace(d, rule="handoff"))  # "the loader keeps up"
    persistent = Prediction(top.cause, "set persistent_workers=True",
                            ProposedSettings(persistent_workers=True),
                            0.0, 0.1, 1.0, "", "high")
    already = dataclasses.replace(d, loader=dataclasses.replace(d.loader, persistent_workers=True), causes=(
        dataclasses.replace(top, prediction=persistent),) + d.causes[1:])
    assert any("already is" in c for c in story.contradictions(already))
    alone = dataclasses.replace(d, who=dataclasses.replace(d.who, world_size=1),
                                straggler=Straggler(0, "p", "n", 0.5, ""))
    assert any("single-rank" in c for c in story.contradictions(alone))


def test_a_single_rank_job_names_no_straggler_and_a_rank_of_a_larger_one_does():
    tr = _steady_slow_mount()
    tr.ident = dict(tr.ident, world_size=1)
    d = diagnosis.analyse(tr)
    assert d.verdict == "input_bound" and d.straggler.rank is None
    assert "one rank" in d.straggler.note
    tr.ident = dict(tr.ident, world_size=4)  # its peers are on other nodes
    assert diagnosis.analyse(tr).straggler.rank == tr.ident["rank"]


def test_both_paths_name_a_straggler_only_over_the_line_with_other_ranks():
    from stallscope.correlate import rules
    from stallscope.vocabulary import DATA_WAIT_LINE
    assert not rules.names_straggler(DATA_WAIT_LINE / 2, 4)   # a healthy job's worst rank
    assert not rules.names_straggler(0.5, 1)                  # a job of one rank
    assert rules.names_straggler(0.5, 4) and not rules.names_straggler(None, 4)


def test_the_peers_of_a_rank_hung_before_its_first_batch_are_its_victims():
    """Drawn scenarios (issue 49): a /dev/shm with room for one batch hung rank 2 in next()
    from the start; ranks 0 and 1, stuck in the all_reduce after one batch, read 'unknown,
    only 1 batch'. They are its victims, naming it."""
    from stallscope.correlate.trace import RankTrace
    from stallscope.lab import synth

    SEC = synth.SEC
    t0 = 100 * SEC
    hung = dict(synth.body([], rank=2, workers=3),
                open_wait={"t_end_ns": t0 + 24 * SEC, "wait_ns": 24 * SEC, "interval_ns": 24 * SEC})
    victim = synth.body([(t0 + SEC // 10, SEC // 10, SEC // 10)], rank=0, workers=3)
    ranks = [RankTrace.from_timeline(b) for b in (victim, hung)]
    d = diagnosis.analyse(ranks[0], ranks, node="node-a")
    assert d.verdict == "not_input_bound" and d.rule == "victim", d.reason
    assert d.straggler.rank == 2 and d.straggler.hung and "blocked in next() for 24 s" in d.reason
    assert not d.causes and story.contradictions(d) == []
    # diagnose names it too, though Prometheus has no share for a rank with no batch
    from stallscope.correlate import codec
    from stallscope.diagnose import report as report_mod
    from tests.helpers.diagnose import cluster, row, subject
    back = codec.decode(codec.encode(d))
    assert back.straggler.hung
    me = subject(row(0, "p0", "node-a", 0.0), job_ranks=3)
    # the cluster's worst rank with batches is under the line (the hung one has none)
    cl = cluster(straggler=row(1, "p1", "node-a", 0.001), job_ranks=3)
    named = report_mod._straggler(cl, back, me)
    assert named is not None and named.rank == 2
    me = diagnosis.analyse(ranks[1], ranks, node="node-a")
    assert me.verdict == "input_bound"
