"""Everything a run creates is undone, in reverse order, whatever ends the run.

``Teardown`` is a stack of undo actions. Inside ``with Teardown() as td`` SIGINT and
SIGTERM raise ``Interrupted`` in the main thread (so blocking waits end at once), and
the stack unwinds in ``__exit__``; while it unwinds, further signals are noted but do not
interrupt the undo actions. The processes a run starts are children that die with it and
are stopped by group (``children``); cgroups are removed once their tasks are gone
(``rmdir_cgroup``).
"""
import os
import signal
import sys
import time


class Interrupted(Exception):
    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self):
        return 128 + self.signum


class Teardown:
    def __init__(self, log=None):
        self.actions = []  # (description, fn)
        self.log = log or (lambda msg: None)
        self.signalled = None
        self.unwinding = False
        self._old = {}

    def push(self, description, fn, *args, **kwargs):
        self.actions.append((description, lambda: fn(*args, **kwargs)))

    def _handler(self, signum, frame):
        self.signalled = self.signalled or signum
        if not self.unwinding:
            raise Interrupted(signum)

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handler)
        return self

    def unwind(self):
        self.unwinding = True
        errors = []
        while self.actions:
            description, fn = self.actions.pop()
            try:
                fn()
            except Interrupted:
                pass
            except Exception as e:
                errors.append("%s: %s" % (description, e))
        for e in errors:
            print("stallscope: cleanup: %s" % e, file=sys.stderr)
        return errors

    def __exit__(self, exc_type, exc, tb):
        try:
            self.unwind()
        finally:
            for sig, old in self._old.items():
                signal.signal(sig, old)
        return False


def rmdir_cgroup(path):
    """Remove a cgroup directory the run made (v1 or v2). A cgroup can be removed once its
    last task has exited, and the kernel may take a moment after the task was reaped:
    tasks still in it are moved to the parent, and the rmdir is retried for 5 s."""
    tasks = os.path.join(path, "cgroup.procs")
    parent = os.path.join(os.path.dirname(path), "cgroup.procs")
    for _ in range(100):
        try:
            with open(tasks) as f:
                pids = f.read().split()
            for pid in pids:
                try:
                    with open(parent, "w") as f:
                        f.write(pid)
                except OSError:
                    pass
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)
    os.rmdir(path)


def wait_for(pred, timeout, interval=0.2):
    """Poll ``pred`` until it is true or ``timeout`` passes; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)
