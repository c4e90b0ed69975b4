"""Scenarios drawn at random (lab/sampler.py, lab/draws.py; issue 49, item 6).

- the sampler: deterministic from its seed, every parameter in its declared range, and
  the ranges covered (the dimensions the issue names);
- the recorded evaluation set (tests/data/draws): every draw's stored inputs are what
  its seed draws, it replays through the analysis in seconds, and its size stays small;
  the per-class table is printed (the figures of the analysis as it is: not asserted,
  the analysis is being rewritten);
- a fixed handful of draws live (``stallscope lab sample``, ~40 s each on this 2-core
  machine, two in CI, the third in ``make test-lab``): the recording holds every rank's
  timeline, the measured data-wait follows what was injected, the replay judges every
  rank, and nothing is left behind.
"""
import dataclasses
import gzip
import json
import os
import time

import pytest

from stallscope import vocabulary
from stallscope.correlate.model import Prediction, ProposedSettings
from stallscope.lab import draws, sampler
from stallscope.lab.commands import PATHS
from tests.helpers.lab import leftovers, run_lab

SAMPLED_SEEDS = range(300)


def _plan(d):
    return {**d.everyone, **d.target}


def test_a_draw_is_the_same_from_the_same_seed_and_in_its_ranges():
    seen = {k: set() for k in ("shape", "spare_cores", "cache", "ranks", "workers", "batch", "class")}
    for seed in SAMPLED_SEEDS:
        for klass in sampler.CLASSES:
            d = sampler.draw(seed, klass)
            assert d == sampler.draw(seed, klass)
            assert sampler.Draw.from_json(json.loads(json.dumps(d.to_json()))) == d
            assert d.cause == (None if klass == "healthy" else vocabulary.cause(klass).name)
            assert 1 <= d.ranks <= 4 and d.target_rank == d.ranks - 1
            assert sampler.DURATION_S[0] <= d.duration <= sampler.DURATION_S[1]
            plan = _plan(d)
            assert 0 <= plan.get("workers", 2) <= 8
            assert plan["batch_size"] in sampler.BATCH
            assert sampler.STEP_S[0] <= plan["compute_s"] <= sampler.STEP_S[1]
            if klass == "healthy":  # the loader delivers 1.5-4x what the step needs
                assert 1 / sampler.MARGIN[1] - 1e-3 <= d.severity <= 1 / sampler.MARGIN[0] + 1e-3
            elif d.severity is not None and d.shape not in ("dead",):
                assert sampler.SEVERITY[0] <= d.severity <= sampler.SEVERITY[1], d
            fault = d.make_fault()  # every fault of the draw builds, PlainReads first
            assert isinstance(fault.parts[0], sampler.PlainReads)
            assert d.scenario().real.ranks == d.ranks
            seen["shape"].add(d.shape)
            seen["spare_cores"].add(d.spare_cores)
            seen["cache"].add(d.cache)
            seen["ranks"].add(d.ranks)
            seen["workers"].add(plan.get("workers", 2))
            seen["batch"].add(plan["batch_size"])
        seen["class"].add(sampler.draw(seed).klass)
    # the dimensions, each drawn
    assert seen["shape"] == {"steady", "bursty", "ramping", "hang", "dead"}
    assert seen["spare_cores"] == {True, False}
    assert seen["cache"] == {"none", "warm", "cold"}
    assert seen["ranks"] == {1, 2, 3, 4}
    assert seen["workers"] == set(range(9))
    assert seen["batch"] == set(sampler.BATCH)
    assert seen["class"] == set(sampler.CLASSES)


def test_a_schedule_comes_and_goes_or_ramps_up():
    assert sampler.level("steady", 3.0, 20) == 1.0
    assert sampler.level("bursty", 1.0, 20, period=8, on=4) == 1.0
    assert sampler.level("bursty", 5.0, 20, period=8, on=4, low=0.15) == 0.15
    assert sampler.level("bursty", 9.0, 20, period=8, on=4) == 1.0
    ramp = [sampler.level("ramping", t, 20, low=0.2) for t in (0, 3, 6, 12, 18)]
    assert ramp[0] == 0.2 and ramp == sorted(ramp) and ramp[-2:] == [1.0, 1.0]


class _Job:
    """What runner._window reads of a lab job: its target's batch count moves as told."""

    def __init__(self, duration, counts):
        self.duration, self.target, self.prom = duration, 1, None
        self.counts, self.t0 = counts, time.monotonic()
        self.fault = type("Fault", (), {"tick": lambda *a: None})()
        self.say = lambda line: None

    def check_alive(self):
        pass

    def ranks(self):
        made = self.counts(time.monotonic() - self.t0)
        return {r: {"rank": r, "batches": n, "step_seconds_total": n * 0.1, "data_wait_seconds_total": 0.0}
                for r, n in ((0, 99), (1, made))}


@pytest.mark.parametrize("counts,until,at_least,at_most", [
    (lambda t: int(4 * t), 0.3, 0.3 + 1.0, 0.3 + 1.0 + 1.3),  # slow but moving: EXTEND_MAX_S more
    (lambda t: 3, 0.3, 0.6, 0.6 + 1.3),                       # stopped from the start (a hang)
    (lambda t: 10 ** 6, 0.3, 0.3, 0.3 + 1.3),                 # enough batches: at its duration
])
def test_a_drawn_run_goes_on_until_its_target_has_the_batches_a_verdict_needs(
        monkeypatch, counts, until, at_least, at_most):
    """A drawn CPU-contention run of 23 s made 14 batches of 1.6 s and the agent said
    "unknown" (issue 49): a draw's window goes on past its duration until the target has
    the correlator's MIN_BATCHES and a few in its last ``duration`` seconds (the window
    judged), EXTEND_MAX_S at most, or stops making them."""
    from stallscope.lab import runner

    monkeypatch.setattr(runner, "EXTEND_MAX_S", 1.0)
    monkeypatch.setattr(runner, "STALLED_S", 0.6)
    job = _Job(until, counts)
    t0 = time.monotonic()
    runner._window(job, {}, live=False, until_verdict=True)
    took = time.monotonic() - t0
    assert at_least <= took <= at_most, took
    job = _Job(0.3, lambda t: 1)
    runner._window(job, {}, live=False)  # a scenario's run: its duration
    assert job.duration == 0.3


def test_a_run_too_slow_for_its_window_is_judged_over_the_batches_a_verdict_needs():
    """Seed 426 (issue 49): batches of 1.6 s, a 27 s window held 19 however long the run
    went on, and the victims' agent said "unknown". The judged window widens back to
    where the target had made EXTEND_BATCHES fewer; a run fast enough keeps its own."""
    from stallscope.lab import runner

    def history(step_s, seconds):
        return [(float(t), {1: {"batches": int(t / step_s)}}) for t in range(int(seconds) + 1)]
    need = runner.EXTEND_BATCHES
    slow = history(1.6, 57)      # 35 batches in 57 s; the last 23 of them span 36.8 s
    got = runner.verdict_seconds(slow, 1, 22.0)
    assert 1.6 * need <= got <= 1.6 * need + 2.6, got
    assert runner._trailing(slow, 1, got) >= need
    assert runner.verdict_seconds(history(0.5, 57), 1, 22.0) == 22.0   # 44 batches in 22 s
    # fewer batches than a verdict needs in the whole run: all of it
    assert runner.verdict_seconds(history(4.0, 57), 1, 22.0) == 58.0
    assert runner.verdict_seconds([(0.0, {}), (5.0, {})], 1, 22.0) == 22.0  # no count known


def test_an_unknown_class_is_one_clear_line():
    r = run_lab("sample", "--seed", 1, "--class", "no_such_class", timeout=60)
    assert r.returncode == 2 and "no_such_class" in r.stderr and "Traceback" not in r.stderr


# Recorded draws the analysis does not name right, and why (the evidence recorded lacks it)
KNOWN_MISSES = {
    # the sampler read the workers' fetches as idle: a worker first found polling its index
    # queue was not checked for a connection again for 30 s (fixed in 832775d, after it ran)
    "draw-100-cache-miss": "the recorded sampler saw no network wait",
    # the same with 832775d: the target's 4 workers fetching 200 ms misses read 99 %
    # idle and at most 13 % on the network, so the budget holds no network wait and the
    # loader's spread names too_few_workers (recorded live at 5ceb42a): one listing of a
    # worker's sockets served all its polls for 5 s (listed per poll site since 6b67298)
    "draw-413-cache-miss": "the recorded sampler saw the fetching workers idle",
}


def test_the_recorded_draws_replay_and_hold_the_inputs_their_seeds_draw(capsys):
    docs = draws.load([draws.DEFAULT_DIR])
    assert docs, "no recorded draws in %s" % draws.DEFAULT_DIR
    sizes = {path: os.path.getsize(path) for path, _ in docs}
    assert max(sizes.values()) < 200_000, max(sizes.items(), key=lambda kv: kv[1])
    # the 20 fresh draws a class (11 classes) and the seeds before them, ~35 KB
    # each (18.9 MB at 538 draws), and room for the draws that still judge issue 49
    assert sum(sizes.values()) < 24_000_000
    for path, doc in docs:
        assert draws.check_inputs(doc) == [], path
        assert os.path.basename(path) == os.path.basename(draws.path_of(doc["draw"], ""))
        # the answers recorded live read back typed and write back as they were recorded
        live = doc["live"]
        for answer in [live["diagnose"], live["prometheus"], *live["agent"].values()]:
            assert draws._recorded(draws.Answer.from_json(answer)) == answer, (path, answer)
    t0 = time.monotonic()
    rows = draws.replay_rows(docs)
    took = time.monotonic() - t0
    assert took < 2.0 * len(docs), took  # seconds for the set (0.04 s a draw here)
    for row, (path, doc) in zip(rows, docs):
        answers = row["answers"]
        assert sorted(answers) == [str(r) for r in range(doc["draw"]["ranks"])], path
        assert all(a.verdict in vocabulary.VERDICTS for a in answers.values()), (path, answers)
        s = row["scores"]["replay"]
        assert isinstance(s["top1"], bool) and s["got"] != "error", (path, s)
        # victims are judged where there are any, healthy draws on every rank
        assert (s["victims"] is None) == (len(doc["expected"]["victims"]) == 0
                                          or doc["expected"]["cause"] is None), path
        assert (s["no_input_bound"] is None) == (doc["expected"]["cause"] is not None), path
    # one report, one story (issue 49): no rank's report of any draw contradicts itself
    told_twice = {row["file"]: row["contradictions"] for row in rows if row["contradictions"]}
    assert told_twice == {}, told_twice
    with capsys.disabled():  # the table of the analysis as it is, in the test's output
        print("\nrecorded draws replayed (%d, %.2fs):\n%s" % (len(rows), took, draws.table(rows)))
    # a change to the analysis keeps every draw it names right (issue 49): the misses are
    # the known ones, each with why
    missed = {os.path.basename(path)[:-len(".json.gz")] for row, (path, _) in zip(rows, docs)
              if row["scores"]["replay"]["top1"] is False and row["scores"]["replay"]["held"] is not False}
    assert missed <= set(KNOWN_MISSES), sorted(missed - set(KNOWN_MISSES))


def test_a_replayed_draw_is_scored_against_what_was_injected():
    """The scoring itself, on answers made up for a draw of each kind."""
    d = sampler.draw(29, "too_few_workers")
    doc = {"draw": d.to_json(), "expected": draws.expected(d)}
    stall = draws.Answer("input_bound", "too_few_workers", (("too_few_workers", 0.9),))
    victim = draws.Answer("not_input_bound", None, (), straggler=1)
    assert draws.score(doc, {"0": victim, "1": stall}) == {
        "top1": True, "victims": True, "no_input_bound": None, "prediction": None,
        "got": "input_bound/too_few_workers", "held": None}
    blamed = dataclasses.replace(victim, verdict="input_bound", cause="transfer_cost")
    assert draws.score(doc, {"0": blamed, "1": stall})["victims"] is False
    wrong = dataclasses.replace(victim, straggler=0)
    assert draws.score(doc, {"0": wrong, "1": stall})["victims"] is False
    other = dataclasses.replace(stall, cause="cpu_contention")
    assert draws.score(doc, {"0": victim, "1": other})["top1"] is False
    assert draws.score(doc, {"0": victim, "1": draws.Answer(error="no answer")})["got"] == "error"
    h = sampler.draw(22, "healthy")
    hdoc = {"draw": h.to_json(), "expected": draws.expected(h)}
    calm = draws.Answer("healthy", None, ())
    assert draws.score(hdoc, {"0": calm, "1": calm})["no_input_bound"] is True
    assert draws.score(hdoc, {"0": stall, "1": calm})["no_input_bound"] is False
    # more workers promised past a quota the prediction leaves: crosses the capacity
    q = sampler.draw(1, "cpu_throttle")
    more = Prediction("too_few_workers", "raise num_workers", ProposedSettings(num_workers=8), 0.0, 0.1, 2.0,
                      "", "medium")
    assert draws._prediction_ok("cpu_throttle", q.to_json(), more) is False
    lifted = dataclasses.replace(more, settings=ProposedSettings(num_workers=8, cpu_limit_cores=2.0))
    assert draws._prediction_ok("cpu_throttle", q.to_json(), lifted) is True
    assert draws._prediction_ok("too_few_workers", d.to_json(), more) is True
    # the label against the measured wait: a stall under the line, a healthy job over it
    assert draws.label_held(dict(doc, live={"data_wait": {"0": 0.001, "1": 0.30}})) is True
    assert draws.label_held(dict(doc, live={"data_wait": {"0": 0.001, "1": 0.01}})) is False
    assert draws.label_held(dict(hdoc, live={"data_wait": {"0": 0.001, "1": 0.01}})) is True
    assert draws.label_held(dict(hdoc, live={"data_wait": {"0": 0.001, "1": 0.036}})) is False


# One fixed draw live in CI (~35 s here), the others in `make test-lab`: a CFS quota on
# the target's workers, with a victim (root, cgroup v2: it stands in CI for the lab's
# cpu-throttle scenario, tests/lab/test_scenarios_e2e.py LIVE_ELSEWHERE); too few workers
# with a victim (no root needed: tests/correlate/test_e2e.py drives that cause live in
# CI); a slow FUSE mount read with plain open()/read() (root, FUSE: the lab's
# slow-storage-plain scenario runs that fault live in CI), a healthy job.
LIVE = [(7, "cpu_throttle"),
        pytest.param(29, "too_few_workers", marks=pytest.mark.lab_variant),
        pytest.param(22, "storage_latency", marks=pytest.mark.lab_variant),
        pytest.param(22, "healthy", marks=pytest.mark.lab_variant)]


@pytest.mark.slow
@pytest.mark.parametrize("seed,klass", LIVE)
def test_a_fixed_draw_runs_live_and_is_recorded(seed, klass, tmp_path, capsys):
    pytest.importorskip("torch")
    d = sampler.draw(seed, klass)
    reason = d.make_fault().missing()
    if reason:
        pytest.skip(reason)
    workdir, recorded = tmp_path / "run", tmp_path / "draws"
    r = run_lab("sample", "--seed", seed, "--class", klass, "--record", recorded, "--workdir", workdir,
                "--json", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert leftovers(str(workdir)) == []
    [row] = json.loads(r.stdout)
    [(path, doc)] = draws.load([str(recorded)])
    assert row["file"] == path and path == draws.path_of(d.to_json(), str(recorded))
    with gzip.open(path, "rt") as f:
        assert json.load(f)["draw"] == d.to_json()
    assert draws.check_inputs(doc) == []
    assert os.path.getsize(path) < 100_000
    for body in doc["timelines"]:  # every rank's window, without its first batch
        assert len(body["batches"]) > 10 and body["batches"][0]["t_end_ns"] > body["first_batch_ns"]
    wait = {int(r): w for r, w in doc["live"]["data_wait"].items()}
    target = d.target_rank
    if d.cause is None:  # the loader delivers 1.5x-4x the need: no rank waits past the handoff
        assert max(wait.values()) < 0.05, wait
    else:
        # a steady loader that delivers a batch every severity x the step waits 1 - 1/severity
        # of it; half that at least (the FUSE operations a sample are an estimate), and the
        # victims, who wait in the all_reduce, a fraction of it on their own loaders
        assert d.shape == "steady"
        assert wait[target] > 0.5 * (1 - 1 / d.severity), (wait, d.severity)
        assert all(w < wait[target] / vocabulary.STRAGGLER_FACTOR for r, w in wait.items() if r != target)
    # every path answered about the faulty rank, and the replay judges every rank
    assert set(row["scores"]) >= {"diagnose", "agent", "replay"}
    assert all(s["got"] != "error" for s in row["scores"].values()), row["scores"]
    # and named what was injected on every path (the label held: the fixed draws' faults are
    # far over the line or a healthy job far under it), its victims calm
    assert all(s["top1"] for s in row["scores"].values()), row["scores"]
    assert all(s["victims"] in (None, True) for s in row["scores"].values()), row["scores"]
    assert set(draws.replay(doc)) == {str(r) for r in range(d.ranks)}
    with capsys.disabled():
        print("\n%s (%.0fs): %s" % (d.name, row["wall_s"], draws.detail([row], PATHS)))
