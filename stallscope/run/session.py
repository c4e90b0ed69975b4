"""``stallscope run``: an embedded agent on a private socket, the training command with
the environment that points its ranks there, a live view, and at the end the diagnose
report for the worst rank: printed, and written as JSON and as a self-contained HTML page.

The agent runs as this user, without Prometheus. It reads the GPU through NVML where
there is one; where there is none the report has no GPU signal and says so (a simulated
GPU would follow a lab trainer's phases, which a user's script does not report).

Every rank that reports to the agent is this run's and is followed, whatever its job
name (a ``job=`` in the trainer overrides STALLSCOPE_JOB). The report's first line says
when the training failed or was interrupted; a Ctrl-C, once the training has stopped,
still writes the report of what was measured until then (issue 34).

Ctrl-C (or SIGTERM): the training's process group gets SIGINT (torchrun passes it on to
its ranks), is killed if it has not left within 20 s, the agent stops and the private
directory goes: nothing is left behind.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from ..processes.children import session_kwargs
from ..processes.servers import AgentProcess
from . import html, live
from .outcome import RunOutcome

EXIT_GRACE_S = 20.0


def command_for(cmd, ranks):
    """The command to start: as given, or under torchrun for ``ranks`` > 1 processes. A
    bare ``python``/``python3`` is this Python: the one stallscope (and so the hook) is
    installed in, whatever PATH finds first."""
    cmd = list(cmd)
    if cmd[0] in ("python", "python3"):
        cmd[0] = sys.executable
    if ranks <= 1:
        return cmd
    if os.path.basename(cmd[0]).startswith("python"):
        cmd = cmd[1:]  # torchrun runs the script with this Python
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(ranks)] + list(cmd)


class _Stop(Exception):
    """SIGTERM, handled like Ctrl-C."""


def _on_term(signum, frame):
    raise _Stop()


def run(cmd, ranks=1, json_out="stallscope-run.json", html_out="stallscope-run.html",
        interval=1.0, out=sys.stdout, err=sys.stderr, quiet=False, out_dir=None):
    """Returns the training's exit status (130 when interrupted). ``quiet``: no live view,
    the report only. ``out_dir``: where the report files go (relative names are under
    it; default the working directory)."""
    from . import terminal

    json_out, html_out = (_placed(p, out_dir) for p in (json_out, html_out))
    workdir = tempfile.mkdtemp(prefix="stallscope-run-")
    job = "run-%d" % os.getpid()
    pod = "stallscope-run-%d" % os.getpid()  # the ranks' pod name, for the report
    # Its own session (a terminal's Ctrl-C reaches only us, and we stop it) and it dies with
    # us: a `stallscope run` killed outright left its agent behind (the lab's mechanism).
    agent = AgentProcess(args=["--correlate.interval", "1", "--correlate.window", "30"], workdir=workdir,
                         popen_kwargs=session_kwargs())
    child, relay, seen = None, None, _Seen()
    previous = signal.signal(signal.SIGTERM, _on_term)
    # Ctrl-C stops the run even when we were started with SIGINT ignored (a background
    # job, a parent that ignores it: the full test suite's pytest), which Python keeps.
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    view = live.View(out)
    started = time.monotonic()
    try:
        agent.start()
        # under 80 columns with the usual /tmp (issue 52: ~90 characters wrapped)
        print("stallscope run: private agent in %s (no Prometheus)" % workdir, file=out, flush=True)
        env = dict(os.environ, STALLSCOPE_SOCKET=agent.socket, STALLSCOPE_JOB=job, POD_NAME=pod)
        if view.tty and not quiet:
            relay = terminal.Relay(view, stderr_too=getattr(err, "isatty", lambda: False)())
        try:
            child = subprocess.Popen(command_for(cmd, ranks), env=env, start_new_session=True,
                                     **(relay.popen_kwargs() if relay else {}))
        except OSError as e:
            print("stallscope run: cannot start %s: %s" % (cmd[0], e.strerror), file=err)
            return 127
        if relay:
            relay.started()
        started = time.monotonic()
        while child.poll() is None:
            time.sleep(max(0.0, interval - (time.monotonic() - started) % interval))
            seen.poll(agent.url, time.monotonic())
            if not quiet:
                view.show(time.monotonic() - started, seen.rows(), seen.rates_now())
        code = child.returncode
        if relay:
            relay.close()
        view.close()
        seen.poll(agent.url, time.monotonic())
        finish(agent, pod, seen, time.monotonic() - started, cmd, code, json_out, html_out, workdir,
               out, err)
        return code
    except (KeyboardInterrupt, _Stop):
        view.close()
        print("\nstallscope run: interrupted; stopping the training", file=err)
        _interrupt(child)
        if relay:
            relay.close()
        if child is not None:  # the report of what was measured until then
            seen.poll(agent.url, time.monotonic())
            finish(agent, pod, seen, time.monotonic() - started, cmd, 130, json_out, html_out,
                   workdir, out, err, interrupted=True)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
        if child is not None and child.poll() is None:
            _interrupt(child)
        if relay:
            relay.close()
        view.close()
        agent.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _placed(path, out_dir):
    """A report file's path: as given when absolute (or when there is no ``out_dir``),
    else under ``out_dir``, which is created."""
    if not path or not out_dir or os.path.isabs(path):
        return path
    os.makedirs(out_dir, exist_ok=True)
    return os.path.join(out_dir, path)


class _Seen:
    """Every rank that reported to the run's agent, whatever its job (live.py): the
    agent's entry, the correlator's latest diagnosis with batches in it, the rates."""

    def __init__(self):
        self.entries, self.diagnoses, self.rates = {}, {}, live.Rates()

    def poll(self, agent_url, t):
        for key, entry in live.ranks(agent_url).items():
            self.entries[key] = entry
            self.rates.add(key, t, entry)
            diag = live.diagnosis(agent_url, key[0], key[1])
            if diag is not None and diag.batches:
                self.diagnoses[key] = diag

    def keys(self):
        return sorted(k for k, e in self.entries.items() if e.get("batches"))

    def rows(self):
        return [live.summary(k, self.entries[k], self.diagnoses.get(k)) for k in self.keys()]

    def rates_now(self):
        return {k: self.rates.rate(k, self.entries[k]) for k in self.keys()}

    def jobs(self):
        return sorted({k[0] for k in self.keys()})


def _interrupt(child):
    if child is None or child.poll() is not None:
        return
    try:
        os.killpg(child.pid, signal.SIGINT)
        child.wait(EXIT_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    except ProcessLookupError:
        child.wait()


def outcome(code, elapsed, interrupted=False):
    """The report's first line when the training did not succeed, else None."""
    if interrupted:
        return "INTERRUPTED after %.1fs: the report covers what was measured until then" % elapsed
    if code:
        what = ("killed by signal %d" % -code) if code < 0 else "exit status %d" % code
        return "TRAINING FAILED: %s after %.1fs; the report covers what was measured until then" % (
            what, elapsed)
    return None


def judged(found, rows):
    """(the report, too short?): a finished run is judged on what it measured (issue 34).
    With fewer batches than a verdict needs (the correlator's MIN_BATCHES) the report says
    the run was too short. A rank over the line only by its first batch is "starting ...
    judged once its steps outweigh that start" (correlate/rules.py) while it runs; once the
    run has ended that never comes, and its other batches are what was measured: under the
    line, its loader kept up. ``found``: the typed Report (diagnose/document.py)."""
    import dataclasses

    from ..correlate import rules
    from ..diagnose import nextsteps
    from ..diagnose.document import NextStep
    from ..vocabulary import DATA_WAIT_LINE, MIN_BATCHES

    mine = [r for r in rows if r.rank == found.rank and r.job == found.job]
    n = max((r.batches for r in mine or rows), default=0)
    if n < MIN_BATCHES:
        return dataclasses.replace(
            found, verdict="unknown",
            reason=("too short to judge: %d batches (a verdict needs %d); run it longer, or compare "
                    "it only with runs as short." % (n, MIN_BATCHES)),
            next_steps=(NextStep("Run at least %d batches (and well past the workers' start) for a "
                                 "verdict." % MIN_BATCHES, None),)), True
    waits = [rules.RankWait(r.rank, None, None, r.data_wait_ratio, r.data_wait_ratio_after_start)
             for r in rows]
    if found.verdict == "unknown" and mine and waits and \
            all(w.starting or (w.ratio is not None and not rules.over(w.ratio)) for w in waits):
        me = mine[0]
        found = dataclasses.replace(found, verdict="healthy", reason=(
            "Rank %s waited %.1f%% of its step time, over the %.1f%% line only by its first batch "
            "(its workers' start, once per run); its other batches waited %.1f%%: on what the "
            "finished run measured, its loader kept up." % (
                me.rank, 100 * (me.data_wait_ratio or 0), 100 * DATA_WAIT_LINE,
                100 * (me.data_wait_ratio_after_start or 0))))
        found = dataclasses.replace(found, next_steps=tuple(nextsteps.steps(found)))
    return found, False


def startup(diag):
    """The run's start-up, its first batch while the workers start (paid once), apart from
    its steady state: {startup_seconds, step_seconds_mean_after_start}, empty when the
    window does not hold that batch. The first batch's interval is its wait (the hook's
    iterator start), so with S the window's step time, r its data-wait share and a the
    share without that batch: a = (rS - f) / (S - f), f = S (r - a) / (1 - a)."""
    if diag is None:
        return {}
    r = diag.data_wait_ratio
    a = diag.loop.data_wait_ratio_after_start if diag.loop is not None else None
    total, n = live.step_seconds(diag), diag.batches
    if r is None or a is None or total <= 0 or n < 2 or a >= 1.0:
        return {}
    first = max(0.0, total * (r - a) / (1.0 - a))
    return {"startup_seconds": round(first, 4),
            "step_seconds_mean_after_start": round((total - first) / (n - 1), 6)}


def final_rows(agent_url, seen, window_s, found):
    """The ranks' rows over the report's own window, the reported rank's share the
    report's figure: the Ranks table and the headline show the same number."""
    import dataclasses

    rows = []
    for key in seen.keys():
        diag = live.diagnosis(agent_url, key[0], key[1], seconds=window_s) or seen.diagnoses.get(key)
        loop = diag.loop if diag is not None else None
        row = dataclasses.replace(
            live.summary(key, seen.entries[key], diag),
            data_wait_ratio_after_start=loop.data_wait_ratio_after_start if loop is not None else None,
            **startup(diag))
        if row.rank == found.rank and row.job == found.job and found.data_wait_ratio is not None:
            row = dataclasses.replace(row, data_wait_ratio=found.data_wait_ratio)
        rows.append(row)
    return rows


def finish(agent, pod, seen, elapsed, cmd, code, json_out, html_out, workdir, out, err,
           interrupted=False):
    """The diagnose report of the worst rank (the agent keeps an exited rank ~30 s)."""
    import dataclasses
    import json

    from ..diagnose import document, render, report
    from ..diagnose.errors import DiagnoseError

    first = outcome(code, elapsed, interrupted)
    if not seen.keys():
        if first:
            print(first, file=out)
        print("stallscope run: no batches were reported: is the loader watched "
              "(stallscope.watch or an integration, docs/integrations.md)?", file=err)
        return None
    png = os.path.join(workdir, "timeline.png")
    window_s = min(3600, max(30, int(elapsed) + 5))
    try:
        found = report.run(pod, agent_url=agent.url, window="%ds" % window_s, finished=True)
    except DiagnoseError as e:
        if first:
            print(first, file=out)
        print("stallscope run: no report: %s" % e, file=err)
        return None
    rows = final_rows(agent.url, seen, window_s, found)
    found, too_short = judged(found, rows)
    from . import plot  # matplotlib only here

    try:
        has_plot = bool(plot.write(png, found, window_s))
    except plot.PlotError as e:
        found = dataclasses.replace(found, warnings=found.warnings + ("plot: %s" % e,))
        has_plot = False
    # The agent and its directory go with the run: point at what stays instead, each
    # command runnable as printed (issue 52: a BASELINE.json placeholder, and --stacks,
    # which run does not have)
    commands = ()
    if json_out:
        import shlex
        baseline = os.path.join(os.path.dirname(json_out), "stallscope-baseline.json")
        commands = ("cp %s %s   # keep this run as the baseline" % (
            shlex.quote(json_out), shlex.quote(baseline)),
                    "stallscope compare %s %s   # after your next run: exit 1 when it regressed" % (
                        shlex.quote(baseline), shlex.quote(json_out)))
    found = dataclasses.replace(found, plot=html_out if has_plot and html_out else None, commands=commands)
    ran = RunOutcome.of(cmd, code, elapsed, interrupted, first, seen.jobs(), rows)
    # the JSON report, made once: the diagnose document, whether it was too short, the run
    doc = dict(document.encode(found), too_short=too_short, run=ran.to_json())
    print("", file=out)
    if first:
        print(first, file=out)
    jobs = seen.jobs()
    print("stallscope run: %d rank%s of job%s %s" % (len(rows), "" if len(rows) == 1 else "s",
                                                    "s" if len(jobs) > 1 else "", ", ".join(jobs)), file=out)
    out.write(render.render_text(found))
    if json_out:
        with open(json_out, "w") as f:
            f.write(json.dumps(doc, indent=2, default=str) + "\n")
        print("JSON report: %s" % json_out, file=out)
    if html_out:
        with open(html_out, "w") as f:
            f.write(html.page(found, ran, png if has_plot else None))
        print("HTML report: %s" % html_out, file=out)
    out.flush()
    return doc
