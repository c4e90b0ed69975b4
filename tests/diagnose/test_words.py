"""The report's words (issue 52, item 7), each as a newcomer read it: no "(ns ?)" outside
Kubernetes, "1 rank" not "1 ranks", no stall cost on a healthy run or where no GPU was
read, no cause printed that scores 0.00, "its one worker", and the torch warning about more workers than
CPUs answered where the workers wait off the CPU."""
import subprocess
import sys

from stallscope.correlate.model import GpuView
from stallscope.diagnose import nextsteps, outlook, render
from stallscope.diagnose.document import Cost, EvidenceRow, Sizing
from stallscope.processes.children import child_env
from tests.helpers.diagnose import cause, report

COST = Cost(1, 0.3, 0.3, 7.2, 7.2, "node", None)


def test_no_namespace_is_not_ns_question_mark_and_one_rank_is_singular():
    doc = report(namespace=None, cost=COST, data_wait_ratio=0.3)
    text = render.render_text(doc)
    assert "(ns " not in render.headline(doc) and "pod p: job j" in render.headline(doc)
    assert "(1 rank x 30.0% waiting" in text, text
    assert outlook.plural(1, "rank") == "1 rank" and outlook.plural(3, "rank") == "3 ranks"


def test_the_stall_cost_is_said_only_for_a_stall_and_where_gpus_were_read():
    def cost_lines(**kw):
        return [s for s in outlook.lines(report(cost=COST, **kw)) if s.startswith("Cost now")]
    assert cost_lines(verdict="input_bound")  # no agent view of the GPU: the cluster's figure
    assert cost_lines(verdict="input_bound", gpu=GpuView("gpu_busy_ratio", "nvml", 40))
    assert not cost_lines(verdict="healthy")
    assert not cost_lines(verdict="input_bound", gpu=GpuView())  # the agent read no GPU


def test_a_cause_scored_0_00_is_not_printed():
    doc = report(causes=(cause("too_few_workers", 0.6, summary="slow loader."),
                         cause("cache_miss", 0.004, summary="a long explanation of nothing.")))
    text = render.render_text(doc)
    assert "too_few_workers" in text and "cache_miss" not in text, text


def test_more_workers_than_cores_answers_torchs_warning_when_they_wait_off_the_cpu():
    off_cpu = (EvidenceRow("workers_cpu_ratio / num_workers", 0.0063, 0.7, "above", "ok", "agent"),)
    doc = report(sizing=Sizing(num_workers=2, workers_needed=4, cfs_quota_cores=2.0), evidence=off_cpu,
                 causes=(cause("too_few_workers", 0.6),))
    step = nextsteps.steps(doc)[0].step
    assert step.startswith("Raise num_workers from 2 to 4"), step
    assert "torch will warn that 4 workers are more than its suggested maximum (2" in step, step
    assert "99% off the CPU" in step, step
    busy = (EvidenceRow("workers_cpu_ratio / num_workers", 0.9, 0.7, "above", "over", "agent"),)
    assert "torch will warn" not in nextsteps.steps(report(
        sizing=Sizing(num_workers=2, workers_needed=4, cfs_quota_cores=2.0), evidence=busy,
        causes=(cause("too_few_workers", 0.6),)))[0].step
    # the causes table's advice names no CPU bound beside the count to raise to
    from stallscope import vocabulary
    assert "minus one core" not in vocabulary.cause("too_few_workers").advice


def test_a_time_ahead_is_in_the_future_not_a_bad_time():
    out = subprocess.run([sys.executable, "-m", "stallscope", "diagnose", "p", "--prometheus",
                          "http://127.0.0.1:1", "--at", "+1h"], env=child_env(), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "is in the future" in out.stderr, out.stderr
    assert "bad time" not in out.stderr


def test_one_worker_is_its_one_worker_not_each_of_the_1_workers():
    from stallscope.correlate import workers
    from stallscope.correlate.period import stall_period
    from stallscope.lab import synth
    from tests.helpers.correlate import simulated, trace_of, wire

    ev, _ = simulated(6, 1, load=0.3, compute=0.1)
    s, e = synth.span_of(ev)
    tr = trace_of(ev, workers=1, signals={"batch_load_seconds": synth.sampled(lambda t: 0.3, s, e),
                                          "workers_cpu_ratio": synth.sampled(lambda t: 0.95, s, e)})
    summary = wire(workers.score(tr, stall_period(tr)))["summary"]
    assert "its one worker takes 0.3s" in summary and "each of the 1" not in summary, summary
