"""`make test-compat`: the hook against the torch releases and Pythons users run (issue 34).
Not part of CI (downloads: PyPI's Linux wheels of torch are CUDA builds, ~3 GB a release
with their nvidia-* libraries, which run on the CPU).

- For each torch release: a venv of its own (.compat/torch-X, Python 3.11), torch pinned
  first, then this checkout with its test and fuse extras; the hook's tests (tests/hook) in it, and
  scripts/compat_probe.py: which DataLoader introspections work (settings, worker PIDs,
  the ready/transfer split with pin_memory off and on).
- For each Python (pyenv's 3.9 ... 3.13): the hook's standard-library path, with no
  site-packages at all (`python -S`): `import stallscope`, a watched plain iterable,
  every batch at a real agent (run by this Python, the driver's).

Prints a table and writes .compat/results.json. --clean removes the venvs afterwards.
Exit status 1 when a test run failed, the probe saw the hook raise, or a Python's
batches did not all reach the agent."""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIR = os.path.join(ROOT, ".compat")
# the releases issue 34 names; the newest, 2.15.0, is over the cap a machine-wide pip
# constraint file may set (this one's, /etc/xdg/pip: torch<=2.14.1, the releases it keeps on
# disk): each venv pins its own torch, so the matrix installs with no constraint file
TORCH = ("2.4.1", "2.8.0", "2.11.0", "2.13.0", "2.15.0")
NO_CONSTRAINT = dict(os.environ, PIP_CONSTRAINT=os.devnull)
PYTHONS = ("3.9", "3.10", "3.11", "3.12", "3.13")
PYENV = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")


def find_python(version):
    """pyenv's build of ``version`` (its shims answer only for the global one), else PATH's."""
    found = sorted(glob.glob(os.path.join(PYENV, "versions", version + ".*", "bin", "python" + version)))
    return found[-1] if found else shutil.which("python" + version)


BASE_PYTHON = os.environ.get("COMPAT_PYTHON") or find_python("3.11") or sys.executable

STDLIB_LOOP = """
import sys, time
import stallscope
n = 0
for _ in stallscope.watch(list(range(%d)), job=%r, rank=0):
    time.sleep(0.003)
    n += 1
bad = sorted(m for m in sys.modules if m.split(".")[0] in ("numpy", "torch", "click", "psutil"))
print("batches", n, "non-stdlib", bad)
"""


def sh(cmd, log, env=None, timeout=None):
    with open(log, "a") as f:
        f.write("$ %s\n" % " ".join(cmd))
        f.flush()
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                              timeout=timeout).returncode


def torch_venv(version):
    venv = os.path.join(DIR, "torch-" + version)
    py = os.path.join(venv, "bin", "python")
    log = venv + ".log"
    if not os.path.exists(os.path.join(venv, ".installed")):
        shutil.rmtree(venv, ignore_errors=True)
        if sh([BASE_PYTHON, "-m", "venv", venv], log) or \
                sh([py, "-m", "pip", "install", "-q", "torch==" + version], log, env=NO_CONSTRAINT) or \
                sh([py, "-m", "pip", "install", "-q", "-e", ".[test,fuse]"], log, env=NO_CONSTRAINT):
            return None, log
        open(os.path.join(venv, ".installed"), "w").close()
    return py, log


def torch_row(version, hook_tests):
    py, log = torch_venv(version)
    if py is None:
        return {"torch": version, "installed": False, "log": log}
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    row = {"torch": version, "installed": True, "log": log}
    if hook_tests:
        t0 = time.monotonic()
        rc = sh([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/hook"], log, env, 1800)
        row["hook_tests"] = "pass" if rc == 0 else "FAIL (rc %d, %s)" % (rc, log)
        row["hook_tests_seconds"] = round(time.monotonic() - t0)
    probe = subprocess.run([py, os.path.join(ROOT, "scripts", "compat_probe.py")], env=env,
                           capture_output=True, text=True, cwd=ROOT, timeout=300)
    with open(log, "a") as f:
        f.write(probe.stdout + probe.stderr)
    try:
        row["probe"] = json.loads(probe.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        row["probe"] = {"error": (probe.stderr or probe.stdout)[-500:]}
    row["probe_ok"] = probe.returncode == 0
    return row


def python_row(version):
    """The hook's stdlib path under pyenv's ``version``, against a real agent."""
    from stallscope.processes.servers import AgentProcess

    exe = find_python(version)
    if not exe:
        return {"python": version, "found": False}
    n, job = 200, "py" + version.replace(".", "")
    agent = AgentProcess().start()
    try:
        env = dict(os.environ, PYTHONPATH=ROOT, STALLSCOPE_SOCKET=agent.socket)
        r = subprocess.run([exe, "-S", "-c", STDLIB_LOOP % (n, job)], env=env, capture_output=True,
                           text=True, timeout=120)
        got = 0
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and got < n:
            got = max([x.get("batches", 0) for x in agent.api("/api/v1/ranks").get("ranks") or []
                       if x.get("job") == job] or [0])
            time.sleep(0.25)
    finally:
        agent.stop()
    return {"python": version, "found": True, "exe": exe, "rc": r.returncode,
            "output": (r.stdout + r.stderr).strip()[-400:], "batches_at_agent": got,
            "ok": r.returncode == 0 and got == n and "non-stdlib []" in r.stdout}


def table(rows, pys):
    lines = ["%-8s %-8s %-10s %-8s %-11s %-13s %-28s %s" % (
        "torch", "python", "hook tests", "settings", "worker PIDs", "split", "split (pin)", "hook raised")]
    for r in rows:
        p = r.get("probe") or {}
        a, b = p.get("plain") or {}, p.get("pin_memory") or {}
        if not r["installed"]:
            lines.append("%-8s not installed: %s" % (r["torch"], r["log"]))
            continue
        lines.append("%-8s %-8s %-10s %-8s %-11s %-13s %-28s %s" % (
            r["torch"], p.get("python", "?"), r.get("hook_tests", "-"),
            "yes" if a.get("settings") else "NO", "yes" if a.get("worker_pids") else "NO",
            "%s (%s/%s)" % ("yes" if a.get("split") else "NO", a.get("split_batches"), a.get("batches")),
            "%s (%s/%s)%s" % ("yes" if b.get("split") else "NO", b.get("split_batches"), b.get("batches"),
                              "" if b.get("pin_thread") else " no pin thread"),
            "; ".join(a.get("errors", []) + b.get("errors", [])) or "no"))
    lines.append("")
    lines.append("%-8s %-12s %s" % ("python", "stdlib hook", "batches at the agent"))
    for r in pys:
        lines.append("%-8s %-12s %s" % (r["python"], ("ok" if r.get("ok") else "FAIL") if r["found"]
                                        else "not found", r.get("batches_at_agent", "-")))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--torch", nargs="*", default=list(TORCH))
    ap.add_argument("--pythons", nargs="*", default=list(PYTHONS))
    ap.add_argument("--no-hook-tests", action="store_true", help="the probe only")
    ap.add_argument("--clean", action="store_true", help="remove the venvs afterwards")
    args = ap.parse_args()
    os.makedirs(DIR, exist_ok=True)
    sys.path.insert(0, ROOT)
    rows = [torch_row(v, not args.no_hook_tests) for v in args.torch]
    pys = [python_row(v) for v in args.pythons]
    with open(os.path.join(DIR, "results.json"), "w") as f:
        json.dump({"torch": rows, "python": pys}, f, indent=2)
    print(table(rows, pys))
    if args.clean:
        for v in args.torch:
            shutil.rmtree(os.path.join(DIR, "torch-" + v), ignore_errors=True)
    failed = [r for r in rows if not r["installed"] or not r.get("probe_ok")
              or str(r.get("hook_tests", "pass")).startswith("FAIL")]
    failed += [r for r in pys if r["found"] and not r.get("ok")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
