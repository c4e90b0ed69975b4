"""One report, one story (issue 49): over every recorded lab trace (and every drawn
scenario where the evaluation set has them), the verdict line, the causes' sentences and
the predictions do not contradict one another; the checker itself catches each kind of
contradiction it names."""
import dataclasses
import glob
import json
import os

import pytest

from stallscope.correlate import diagnosis, story
from stallscope.correlate.model import Prediction, Straggler
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
    persistent = Prediction(top.cause, "set persistent_workers=True", {"persistent_workers": True},
                            0.0, 0.1, 1.0, "", "high")
    already = dataclasses.replace(d, loader=dict(d.loader, persistent_workers=True), causes=(
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
