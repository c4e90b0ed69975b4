"""``stallscope run``: an embedded agent on a private socket, the training command with
the environment that points its ranks there, a live view, and at the end the diagnose
report for the worst rank: printed, and written as JSON and as a self-contained HTML page.

The agent runs as this user, without Prometheus. It reads the GPU through NVML where
there is one; where there is none the report has no GPU signal and says so (a simulated
GPU would follow a lab trainer's phases, which a user's script does not report).

Ctrl-C (or SIGTERM): the training's process group gets SIGINT (torchrun passes it on to
its ranks), is killed if it has not left within 20 s, the agent stops and the private
directory goes: nothing is left behind.
"""
import json
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
        interval=1.0, out=sys.stdout, err=sys.stderr):
    """Returns the training's exit status (130 when interrupted)."""
    workdir = tempfile.mkdtemp(prefix="stallscope-run-")
    job = "run-%d" % os.getpid()
    pod = "stallscope-run-%d" % os.getpid()  # the ranks' pod name, for the report
    # Its own session (a terminal's Ctrl-C reaches only us, and we stop it) and it dies with
    # us: a `stallscope run` killed outright left its agent behind (the lab's mechanism).
    agent = AgentProcess(args=["--correlate.interval", "1", "--correlate.window", "30"], workdir=workdir,
                         popen_kwargs=session_kwargs())
    child, bodies = None, {}
    previous = signal.signal(signal.SIGTERM, _on_term)
    # Ctrl-C stops the run even when we were started with SIGINT ignored (a background
    # job, a parent that ignores it: the full test suite's pytest), which Python keeps.
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    view = live.View(out)
    try:
        agent.start()
        print("stallscope run: agent on a private socket in %s (no Prometheus)" % workdir, file=out,
              flush=True)
        env = dict(os.environ, STALLSCOPE_SOCKET=agent.socket, STALLSCOPE_JOB=job, POD_NAME=pod)
        try:
            child = subprocess.Popen(command_for(cmd, ranks), env=env, start_new_session=True)
        except OSError as e:
            print("stallscope run: cannot start %s: %s" % (cmd[0], e.strerror), file=err)
            return 127
        started = time.monotonic()
        while child.poll() is None:
            time.sleep(max(0.0, interval - (time.monotonic() - started) % interval))
            for rank in live.ranks(agent.url, job):
                body = live.diagnosis(agent.url, job, rank)
                if body and body.get("batches"):
                    bodies[rank] = body
            view.show(time.monotonic() - started, bodies)
        code = child.returncode
        elapsed = time.monotonic() - started
        finish(agent, pod, bodies, elapsed, cmd, code, json_out, html_out, workdir, out, err)
        return code
    except (KeyboardInterrupt, _Stop):
        print("\nstallscope run: interrupted; stopping the training", file=err)
        _interrupt(child)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
        if child is not None and child.poll() is None:
            _interrupt(child)
        agent.stop()
        shutil.rmtree(workdir, ignore_errors=True)


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


def finish(agent, pod, bodies, elapsed, cmd, code, json_out, html_out, workdir, out, err):
    """The diagnose report of the worst rank (the agent keeps an exited rank ~30 s)."""
    import dataclasses

    from ..diagnose import document, render, report
    from ..diagnose.errors import DiagnoseError

    if not bodies:
        print("stallscope run: no batches were reported: is the loader watched "
              "(stallscope.watch or an integration, docs/integrations.md)?", file=err)
        return None
    png = os.path.join(workdir, "timeline.png")
    window = "%ds" % min(3600, max(30, int(elapsed) + 5))
    try:
        found = report.run(pod, agent_url=agent.url, window=window, plot=png, finished=True)
    except DiagnoseError as e:
        print("stallscope run: no report: %s" % e, file=err)
        return None
    # The agent and its directory go with the run: point at what stays instead.
    has_plot = bool(found.plot)
    compare = "stallscope compare BASELINE.json %s   # exit 1 when this run regressed" % (
        json_out or "THIS.json")
    found = dataclasses.replace(found, plot=html_out if has_plot and html_out else None, commands=(compare,))
    doc = document.encode(found)
    doc["run"] = {"command": list(cmd), "exit_status": code, "elapsed_seconds": round(elapsed, 1),
                  "ranks": [live.summary(r, b) for r, b in sorted(bodies.items())]}
    print("", file=out)
    out.write(render.render_text(found))
    if json_out:
        with open(json_out, "w") as f:
            f.write(json.dumps(doc, indent=2, default=str) + "\n")
        print("JSON report: %s" % json_out, file=out)
    if html_out:
        with open(html_out, "w") as f:
            f.write(html.page(doc, png if has_plot else None, found))
        print("HTML report: %s" % html_out, file=out)
    out.flush()
    return doc
