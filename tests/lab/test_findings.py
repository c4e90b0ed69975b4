"""The lab's check that the headline alert and diagnose agree (findings.sli_alert,
agreement.agreement, agreement.judged_*) and the scoreboard's column for it: pure
functions over typed numbers, no job."""
from stallscope.correlate.model import RankRow
from stallscope.lab import agreement as ag
from stallscope.lab import findings, scoreboard
from tests.helpers.diagnose import diagnosis, replace, report


def counters(wait, step):
    return {"data_wait_seconds_total": wait, "step_seconds_total": step, "batches": int(step / 0.15)}


def history(ratio_at, seconds=25, ranks=(0, 1)):
    """Samples every second of ranks that step 1 s per second and wait ratio_at(rank, t)
    of each second."""
    out, totals = [], {r: [0.0, 0.0] for r in ranks}
    for t in range(seconds + 1):
        if t:
            for r in ranks:
                totals[r][0] += ratio_at(r, t)
                totals[r][1] += 1.0
        out.append((float(t), {r: counters(*totals[r]) for r in ranks}))
    return out


def test_sli_alert_fires_when_the_worst_rank_stays_over_the_line_for_its_for():
    margin = findings.sli_alert(history(lambda r, t: 0.03 if r == 1 else 0.012))
    assert margin.firing and margin.source == "sli"
    assert margin.peak_ratio == 0.03 and margin.longest_over_s >= 10
    assert (margin.rate_window_s, margin.for_s) == (10.0, 5.0)  # the lab's mixin
    floor = findings.sli_alert(history(lambda r, t: 0.015))
    assert not floor.firing and floor.longest_over_s == 0.0


def test_sli_alert_does_not_fire_on_a_stall_shorter_than_its_for():
    # 0.6 s of waiting in one second: the 10 s rate is 6% for 10 s... unless "for" is longer
    spike = findings.sli_alert(history(lambda r, t: 0.6 if (r, t) == (1, 12) else 0.01), for_s=15)
    assert not spike.firing and 5 <= spike.longest_over_s < 15
    assert findings.sli_alert(history(lambda r, t: 0.6 if (r, t) == (1, 12) else 0.01)).firing
    assert findings.sli_alert([(0.0, {})]).firing is False  # nothing measured: silent


def rank(r, verdict, mine, job=None):
    return ag.Judged(r, verdict, mine, mine if job is None else job)


FIRING = ag.AlertState(True, "prometheus", longest_over_s=14.0, for_s=5.0, rate_window_s=10.0)
SILENT = ag.AlertState(False, "sli", longest_over_s=0.0, for_s=5.0, rate_window_s=10.0)


def test_a_firing_alert_agrees_with_a_victim_and_its_input_bound_straggler():
    a = ag.agreement(FIRING, [rank(0, "not_input_bound", 0.014, 0.25), rank(3, "input_bound", 0.25)])
    assert a.state == "agree" and a.alert == "firing" and a.source == "prometheus"
    assert a.verdicts == ("0:not_input_bound", "3:input_bound")


def test_a_firing_alert_disagrees_with_healthy_or_no_verdict():
    a = ag.agreement(FIRING, [rank(0, "healthy", 0.019)])
    assert a.state == "disagree" and "rank 0 healthy" in a.why
    b = ag.agreement(replace(FIRING, peak_ratio=0.026, longest_over_s=6.0), [rank(0, "healthy", 0.019)])
    assert "peaked at 2.6% and stayed over the line 6s; over diagnose's window it waited 1.9%" in b.why
    c = ag.agreement(FIRING, [rank(0, "not_input_bound", 0.01, 0.03), rank(1, "unknown", None)])
    assert c.state == "disagree" and "without a verdict" in c.why


def test_a_silent_alert_agrees_with_healthy():
    a = ag.agreement(SILENT, [rank(0, "healthy", 0.012)])
    assert a.state == "agree" and a.alert == "silent" and a.source == "sli"


def test_a_silent_alert_with_another_verdict_is_explained_or_a_disagreement():
    elsewhere = ag.agreement(SILENT, [rank(0, "not_input_bound", 0.01, 0.012)])
    assert elsewhere.state == "explained" and "outside its loader" in elsewhere.why
    brief = replace(SILENT, longest_over_s=3.0)  # over the line, never for 5 s in 10 s windows
    short = ag.agreement(brief, [rank(1, "input_bound", 0.024)])
    assert short.state == "explained" and "3s at most" in short.why and "2.4%" in short.why
    held = replace(SILENT, longest_over_s=12.0)  # the SLI held: the alert should have fired
    assert ag.agreement(held, [rank(1, "input_bound", 0.03)]).state == "disagree"
    missing = ag.AlertState(False, "prometheus")  # no SLI numbers to explain it with
    assert ag.agreement(missing, [rank(1, "input_bound", 0.03)]).state == "disagree"
    few = ag.agreement(SILENT, [rank(0, "unknown", None)])
    assert few.state == "explained" and "too few batches" in few.why
    assert ag.agreement(SILENT, []).state == "disagree"


def test_judged_ranks_from_diagnose_reports_or_from_every_agent_diagnosis():
    first = report(rank=0, verdict="not_input_bound", data_wait_ratio=0.01, job_max_data_wait_ratio=0.3)
    last = report(rank=1, verdict="input_bound", data_wait_ratio=0.3, job_max_data_wait_ratio=0.3)
    assert ag.judged_reports([first, last]) == [rank(0, "not_input_bound", 0.01, 0.3),
                                                rank(1, "input_bound", 0.3, 0.3)]
    per_rank = {1: diagnosis("input_bound", data_wait_ratio=0.3,
                             job_ranks_on_node=(RankRow(0, "p0", 0.01),)),
                0: diagnosis("not_input_bound", data_wait_ratio=0.01,
                             job_ranks_on_node=(RankRow(1, "p1", 0.3),)),
                2: None}  # the agent gave none
    assert ag.judged_diagnoses(per_rank) == [
        rank(0, "not_input_bound", 0.01, 0.3), rank(1, "input_bound", 0.3, 0.3),
        rank(2, "unknown", None, None)]


def result(state, why="", source="prometheus", ok=True):
    cause = {"cause": "too_few_workers", "rank": 1}
    return {"expected": cause, "found": cause,
            "alerts": {"matched": True, "fired": ["StallscopeDataWaitHigh"]},
            "ranks": [{"data_wait_ratio": 0.01}, {"data_wait_ratio": 0.03}],
            "agreement": {"state": state, "why": why, "source": source, "alert": "firing",
                          "verdicts": ["1:input_bound"]}, "ok": ok}


def test_the_scoreboard_shows_the_column_and_why_when_it_is_not_plain_agreement():
    rows = [scoreboard.row("margin", result("agree")),
            scoreboard.row("healthy", result("explained", why="rank 0 waits outside its loader")),
            scoreboard.row("victims", result("disagree", why="rank 0 healthy", ok=False)),
            scoreboard.row("cpu-throttle", skipped="needs root")]
    assert [r["agreement"] for r in rows] == ["agree", "explained", "disagree", None]
    out = scoreboard.render(rows)
    head, _, margin, healthy, why_h, victims, why_v, skipped, total = out.splitlines()
    assert "alert~verdict" in head
    assert "agree" in margin.split() and "explained" in healthy.split() and "DISAGREE" in victims.split()
    assert why_h.strip() == "alert~verdict: rank 0 waits outside its loader"
    assert why_v.strip() == "alert~verdict: rank 0 healthy"
    assert "skipped: needs root" in skipped
    assert total.startswith("2/3 scenarios ok, 1 skipped") and "alert from Prometheus" in total


def test_the_slowed_worker_is_expected_by_its_pid_and_shown_named_against_it():
    # the plan slows the target's worker 2: its PID as the rank reported its workers
    import types

    from stallscope.lab import scenarios
    lab = types.SimpleNamespace(scenario=scenarios.get("slow-worker"), target=1)
    rows = [{"rank": 0, "worker_pids": [10, 11, 12, 13]}, {"rank": 1, "worker_pids": [20, 21, 22, 23]}]
    assert findings.expected_worker_pid(lab, rows) == 22
    assert findings.expected_worker_pid(types.SimpleNamespace(scenario=scenarios.get("too-few-workers"),
                                                              target=1), rows) is None
    assert findings.expected_worker_pid(lab, [{"rank": 1, "worker_pids": []}]) is None
    r = result("agree")
    r["expected"] = dict(r["expected"], cause="slow_worker", worker_pid=22)
    r["found"] = dict(r["found"], cause="slow_worker", worker_pid=21)
    out = scoreboard.render([scoreboard.row("slow-worker", r)])
    assert "worker named/slowed: pid 21/22" in out


def _setup_lab(warns):
    from types import SimpleNamespace

    from stallscope.lab import scenarios
    real = scenarios.RealRun(warns=warns)
    return SimpleNamespace(world=2, target=1, scenario=SimpleNamespace(real=real))


def _warned(**ranks):
    return {str(r[1:]): {"warned": sorted(names), "unknown": []} for r, names in ranks.items()}


def test_the_set_up_checks_must_fail_on_the_target_alone_and_at_the_first_batch():
    lab = _setup_lab(("no_workers_with_gpu", "workers_restart_each_epoch"))
    first = {"after_s": 0.5, "ranks": _warned(r0=[], r1=["no_workers_with_gpu"])}
    end = _warned(r0=[], r1=["no_workers_with_gpu", "workers_restart_each_epoch"])
    assert findings.judge_setup(lab, first, end)["matched"]
    # the epoch check is judged at the end only; every other one already at the first batch
    late = {"after_s": 6.0, "ranks": _warned(r0=[], r1=[])}
    assert findings.judge_setup(lab, late, end)["problems"] == [
        "rank 1 at the first batch: none, expected ['no_workers_with_gpu']"]
    # a peer's warning is a failed check too (a healthy set-up warns of nothing)
    noisy = _warned(r0=["pin_memory_off_with_gpu"], r1=["no_workers_with_gpu", "workers_restart_each_epoch"])
    assert findings.judge_setup(lab, first, noisy)["problems"] == [
        "rank 0 at the end: ['pin_memory_off_with_gpu'], expected none"]


def test_a_scenario_names_only_declared_checks_and_every_check_has_a_real_case():
    import pytest

    from stallscope import vocabulary
    from stallscope.lab import scenarios
    with pytest.raises(ValueError, match="not declared"):
        scenarios._checks("no_such_check")
    cased = {name for s in scenarios.REAL for name in s.real.warns or ()}
    # /dev/shm too small for the batches: a real run of its own (tests/agent/test_small_shm.py),
    # the warning at the first batch, then torch's allocation error named shm_exhaustion
    assert cased | {"shm_too_small"} == {c.name for c in vocabulary.CHECKS}


def test_a_recording_leaves_the_process_first_batch_out_as_the_window_does():
    from stallscope.lab import traces
    body = {"first_batch_ns": 200, "batches": [{"t_end_ns": t} for t in (200, 300, 400)]}
    assert [b["t_end_ns"] for b in traces.without_first_batch(body)["batches"]] == [300, 400]
    assert len(body["batches"]) == 3  # the agent's body is not changed in place
    # a window that starts after the first batch, or a body without it, stays as it is
    later = {"first_batch_ns": 100, "batches": [{"t_end_ns": 300}]}
    assert traces.without_first_batch(later) == later
    assert traces.without_first_batch({"batches": [{"t_end_ns": 1}]})["batches"] == [{"t_end_ns": 1}]


def test_without_diagnose_the_agents_answers_are_read_typed_and_kept_as_they_came(monkeypatch):
    """The agent path of findings.diagnose: each rank's /api/v1/diagnosis decoded once by
    the codec, the worst input-bound rank's first cause and its worker found; the
    answers themselves (an HTTP error's too) kept as they came for the lab's files."""
    import dataclasses
    import types

    from stallscope.correlate import codec
    from stallscope.correlate.model import WorkerSpread
    from tests.helpers.diagnose import cause

    slow = dataclasses.replace(cause("slow_worker", 0.7), worker=WorkerSpread(
        pid=4242, workers_seen=4, num_workers=4, load_seconds=0.4, others_load_seconds=0.1,
        spread=4.0, consistent=True, wait_share=0.8, held_share=0.7, replayed_wait_ratio=None,
        in_order_false_wait_ratio=None, in_order_false_removes=None, removes_measured_share=None,
        workers={4242: (0.4, 10, 2.0), 4243: (0.1, 10, 0.0)}))
    few = cause("too_few_workers", 0.5)
    bodies = {0: codec.encode(diagnosis("input_bound", data_wait_ratio=0.2, causes=(few,))),
              1: codec.encode(diagnosis("input_bound", data_wait_ratio=0.4, causes=(slow,))),
              2: {"verdict": "unknown", "causes": [], "error": "HTTP 404"}}
    lab = types.SimpleNamespace(target=1)
    monkeypatch.setattr(findings, "via_diagnose", lambda lab: None)
    monkeypatch.setattr(findings, "agent_diagnoses", lambda lab: bodies)
    rows = [{"rank": 0, "data_wait_ratio": 0.2}, {"rank": 1, "data_wait_ratio": 0.4},
            {"rank": 2, "data_wait_ratio": None}]
    found, details, judged = findings.diagnose(lab, rows)
    assert found == {"cause": "slow_worker", "rank": 1, "verdict": "input_bound", "worker_pid": 4242,
                     "source": "agent /api/v1/diagnosis"}
    assert details is bodies
    assert [j.verdict for j in judged] == ["input_bound", "input_bound", "unknown"]
    # none input-bound: the target's own verdict, or unknown where the agent gave none
    bodies = {1: codec.encode(diagnosis("healthy")), 2: bodies[2]}
    monkeypatch.setattr(findings, "agent_diagnoses", lambda lab: bodies)
    assert findings.diagnose(lab, rows)[0]["verdict"] == "healthy"
    assert findings.diagnose(types.SimpleNamespace(target=2), rows)[0]["verdict"] == "unknown"


def test_diagnose_follows_the_straggler_its_report_names_unless_the_rank_is_healthy(monkeypatch):
    """As on-call would (findings.via_diagnose): rank 0's report names the straggler, and
    diagnose runs again on its pod. Also where rank 0 cannot be judged ("unknown"): a
    victim blocked since its first batch behind a rank hung on a full /dev/shm (drawn
    shm_exhaustion 448: diagnose stopped at rank 0's "unknown", every other path named
    shm_exhaustion). A healthy rank 0 is where on-call stops."""
    import types

    from stallscope.diagnose.document import JobRank
    from tests.helpers.diagnose import cause

    hung = JobRank(1, "trainer-1", "n", 1.0)
    asked = []

    def run(pod, **kw):
        asked.append(pod)
        if pod == "trainer-1":
            return report(pod=pod, rank=1, causes=(cause("shm_exhaustion", 0.9),))
        return report(pod=pod, rank=0, verdict=first, causes=(), straggler=hung)
    monkeypatch.setattr(findings.dg, "run", run)
    monkeypatch.setattr(findings.dg, "encode", lambda doc: {"pod": doc.pod})
    lab = types.SimpleNamespace(agents=lambda: [], judged_s=30.0, prom=None, pod=lambda r: "trainer-%d" % r,
                                fault=None, placement=None, say=lambda line: None, kept=True)
    for first, follows in (("unknown", True), ("not_input_bound", True), ("healthy", False)):
        asked.clear()
        found = findings.via_diagnose(lab)[0]
        assert asked == (["trainer-0", "trainer-1"] if follows else ["trainer-0"]), (first, asked)
        assert (found["cause"], found["rank"]) == (("shm_exhaustion", 1) if follows else (None, None)), found
