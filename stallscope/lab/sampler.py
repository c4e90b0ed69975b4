"""Scenarios drawn at random, not chosen (issue 49, item 6): a fault class and its
parameters drawn from wide ranges, deterministically from a seed, for ``stallscope lab
sample`` (lab/draws.py runs, records, replays and scores them).

The lab's scenario table (scenarios.py) holds one setting of each fault, tuned until
stallscope named it; a draw is another setting of the same fault, chosen by a seed: the
worker count (0-8), batch size and step time, the fault steady, bursty or ramping, on
the last rank of 1 to 4, spare cores or none, a cache warm or cold, and a severity from
just over the line (the loader's demand 1.15x what the faulty part delivers) to 4x, or
a hang. Every draw runs the lab's one trainer (lab/trainer.py: ``import stallscope`` and
``loader = stallscope.watch(loader)``, nothing else of stallscope) with its reads made
by plain ``open()``/``pread()`` and HTTP GETs that report nothing (sources.py
``timed`` false), so the agent sees them only from outside, as in a user's run. The
faults are the lab's (faults/); only their schedules over time (a quota or a
per-sample cost that comes and goes or ramps up) are added here, as ``tick``s.

``draw(seed, klass)`` is a pure function: the same seed and class give the same draw
on any machine (random.Random seeded with a string, stable across Python versions), so
a recorded draw (its ``draw`` object) can be checked against a redraw.
"""
import dataclasses
import math
import os
import random
from typing import Optional

from .. import vocabulary
from . import faults, scenarios
from .faults.cpu import CpuQuota

SAMPLER = "stallscope-sampler/1"  # bump when a range or a formula changes
CLASSES = ("healthy", "too_few_workers", "cpu_throttle", "cpu_contention", "storage_latency",
           "fuse_unhealthy", "shm_exhaustion", "bandwidth_bound", "checkpoint_contention",
           "cache_miss", "transfer_cost")
SEVERITY = (1.15, 4.0)       # demand over what the faulty part delivers, drawn log-uniform
MARGIN = (1.5, 4.0)          # healthy: what the loader delivers over the demand
STEP_S = (0.08, 0.3)         # the simulated GPU's step
BATCH = (4, 8, 16, 32)
DURATION_S = (20.0, 28.0)
FUSE_OPS_PER_SAMPLE = 3      # lookup, open, read: each waits the mount's latency (slow-storage-plain)


@dataclasses.dataclass(frozen=True)
class Draw:
    """One drawn scenario: the injected truth (``cause``: the vocabulary's name, None for
    healthy; on the last rank), how it is produced (plan changes of every rank and of the
    target, the faults as ``[name, kwargs]`` of faults/ or of this module), and the draw's
    dimensions as recorded (shape, severity, spare cores, cache)."""
    seed: int
    klass: str
    cause: Optional[str]
    ranks: int
    duration: float
    shape: str                 # steady, bursty, ramping, hang, dead
    severity: Optional[float]  # demand / what the faulty part delivers; healthy: < 1; None: a hang
    spare_cores: bool
    cache: str                 # none, warm, cold
    everyone: dict
    target: dict
    fault: tuple               # ((name, kwargs), ...)
    note: str
    sampler: str = SAMPLER

    @property
    def name(self):
        return "draw-%d-%s" % (self.seed, self.klass.replace("_", "-"))

    @property
    def target_rank(self):
        return self.ranks - 1  # lab/job.py puts the fault on the last rank

    def to_json(self):
        doc = dataclasses.asdict(self)
        doc["fault"] = [[n, dict(kw)] for n, kw in self.fault]
        return doc

    @classmethod
    def from_json(cls, doc):
        doc = dict(doc)
        doc["fault"] = tuple((n, dict(kw)) for n, kw in doc["fault"])
        return cls(**doc)

    def make_fault(self):
        """PlainReads first (every rank's reads report nothing), then the draw's faults."""
        return faults.Combined(PlainReads(), *[_FAULTS[name](**kw) for name, kw in self.fault])

    def scenario(self):
        """The draw as a scenario of the lab's table (one that is in no table)."""
        return scenarios.Scenario(self.name, self.note, self.cause, real=scenarios.RealRun(
            fault=self.make_fault, everyone=dict(self.everyone), target=dict(self.target),
            duration=self.duration, ranks=self.ranks))


class PlainReads(faults.Fault):
    """Not a fault: every rank reads its shards with plain open()/pread() and reports no
    read (sources.py ``timed`` false), as a trainer with only the two public lines does.
    The faults prepared after it that change a rank's source keep that (``timed`` False
    in their draw)."""
    summary = "every rank reads with plain open()/read()"

    def prepare(self, run):
        for plan in run.plans:
            plan["source"] = dict(plan["source"], timed=False)


# -- schedules: a fault that comes and goes, or ramps up --------------------------------
def level(shape, elapsed, duration, period=8.0, on=4.0, low=0.15):
    """The fault's strength in [low, 1] at ``elapsed`` seconds into the window: steady 1;
    bursty 1 for ``on`` seconds of every ``period``, ``low`` between; ramping from ``low``
    to 1 over the first 60 % of the window, then 1."""
    if shape == "bursty":
        return 1.0 if elapsed % period < on else low
    if shape == "ramping":
        return min(1.0, low + (1.0 - low) * elapsed / (0.6 * duration))
    return 1.0


class SleepSchedule(faults.Fault):
    """The target's per-sample wait follows a schedule: the trainer reads it from a file
    every 0.2 s (its plan's ``sample_sleep_file``), this writes it every tick."""

    def __init__(self, sleep_s, shape, period=8.0, on=4.0, low=0.15):
        self.sleep_s, self.shape, self.period, self.on, self.low = sleep_s, shape, period, on, low
        self.path = None
        self.summary = "the target's loader waits %.1f ms a sample, %s" % (sleep_s * 1000, shape)

    def prepare(self, run):
        self.path = os.path.join(run.workdir, "sample-sleep")
        self._write(level(self.shape, 0.0, run.duration, self.period, self.on, self.low))
        run.plans[run.target]["sample_sleep_file"] = self.path

    def _write(self, strength):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            f.write("%.6f" % (self.sleep_s * strength))
        os.replace(tmp, self.path)

    def tick(self, run, elapsed):
        self._write(level(self.shape, elapsed, run.duration, self.period, self.on, self.low))


class QuotaSchedule(CpuQuota):
    """CpuQuota whose quota follows a schedule: bursty, the quota for ``on`` seconds of
    every ``period`` and none between; ramping, from ``start`` cores down to the quota."""

    def __init__(self, cpus, shape, start=None, period=8.0, on=4.0):
        super().__init__(cpus)
        self.shape, self.start, self.period, self.on = shape, start, period, on
        self.path = None
        self.summary += ", %s" % shape

    def prepare(self, run):
        super().prepare(run)
        self.path = run.plans[run.target]["worker_cgroup"]

    def tick(self, run, elapsed):
        if self.shape == "bursty":
            cores = self.cpus if elapsed % self.period < self.on else None
        elif self.shape == "ramping":
            f = min(1.0, elapsed / (0.6 * run.duration))
            cores = self.start + (self.cpus - self.start) * f
        else:
            return
        period = 100000
        if os.path.exists(os.path.join(self.path, "cpu.max")):
            _write(os.path.join(self.path, "cpu.max"), "max %d" % period if cores is None
                   else "%d %d" % (int(cores * period), period))
        else:
            _write(os.path.join(self.path, "cpu.cfs_quota_us"), -1 if cores is None else int(cores * period))


def _write(path, value):
    with open(path, "w") as f:
        f.write(str(value))


def _plain(kind):
    """A FUSE fault of faults/ read with plain open()/read() (DeadFuse and FrozenFuse
    take no ``timed``)."""
    def make(**kw):
        fault = kind(**kw)
        fault.timed = False
        return fault
    return make


_FAULTS = {"CpuQuota": CpuQuota, "QuotaSchedule": QuotaSchedule, "CpuHogs": faults.CpuHogs,
           "SlowFuse": faults.SlowFuse, "DeadFuse": _plain(faults.DeadFuse),
           "FrozenFuse": _plain(faults.FrozenFuse), "DiskCheckpoints": faults.DiskCheckpoints,
           "ColdCache": faults.ColdCache, "ShapedStore": faults.ShapedStore, "TinyShm": faults.TinyShm,
           "SleepSchedule": SleepSchedule}


# -- the draws ---------------------------------------------------------------------------
def _r(x, digits=4):
    return round(float(x), digits)


def _severity(rng):
    lo, hi = SEVERITY
    return _r(math.exp(rng.uniform(math.log(lo), math.log(hi))), 3)


def _shape(rng, *shapes):
    return rng.choice(shapes)


def _schedule(rng, duration):
    period = _r(rng.uniform(6.0, 10.0), 2)
    return {"period": period, "on": _r(period * rng.uniform(0.35, 0.6), 2)}


def _split(t, workers, cpu_cores=0.8):
    """(CPU seconds, wait seconds) of a per-sample cost ``t`` whose workers, all busy,
    use at most ``cpu_cores`` of the node's CPUs (idle cores stay idle)."""
    cpu = t * min(1.0, cpu_cores / max(1, workers))
    return _r(cpu, 5), _r(t - cpu, 5)


def _healthy(rng, d):
    w = rng.randint(1, 8)
    margin = _r(rng.uniform(*MARGIN), 3)
    t = d["compute_s"] * w / (d["batch_size"] * margin)
    variant = rng.choice(("plain", "warm_cache", "fuse", "busy_node"))
    cpu_cap = 0.15 if variant == "busy_node" else 0.4
    cpu = min(t * rng.uniform(0.0, 1.0), cpu_cap * d["compute_s"] / d["batch_size"])
    target = {"workers": w, "sample_cpu_s": _r(cpu, 5), "sample_sleep_s": _r(t - cpu, 5)}
    fault, cache, spare = (), "none", variant != "busy_node"
    if variant == "warm_cache":  # every rank reads through a cache that holds every shard
        fault, cache = (("ColdCache", {"latency": _r(rng.uniform(0.01, 0.04), 3), "cached_every": 1,
                                       "timed": False}),), "warm"
    elif variant == "fuse":  # a FUSE mount fast enough for the loader
        lat = min(0.005, t / FUSE_OPS_PER_SAMPLE / 2)
        target["sample_sleep_s"] = _r(max(0.0, t - cpu - FUSE_OPS_PER_SAMPLE * lat), 5)
        fault = (("SlowFuse", {"latency": _r(lat, 5), "tail_every": 0, "timed": False}),)
    elif variant == "busy_node":  # a busy process beside the loader, whose CPU work is small
        fault = (("CpuHogs", {"hogs": 1}),)
    note = ("healthy (%s): %d workers deliver %.1fx what a %.0f ms step of %d samples needs" % (
        variant, w, margin, d["compute_s"] * 1000, d["batch_size"]))
    return dict(shape="steady", severity=_r(1 / margin, 3), spare_cores=spare, cache=cache,
                target=target, fault=fault, note=note)


def _too_few_workers(rng, d):
    w, s = rng.randint(0, 8), _severity(rng)
    shape = _shape(rng, "steady", "steady", "bursty", "ramping")
    b, c = d["batch_size"], d["compute_s"]
    # W workers deliver a batch every B t / W; the main process alone (W = 0) adds B t to the step
    t = s * c * w / b if w else (s - 1) * c / b
    cpu, wait = _split(t, w)
    target = {"workers": w, "sample_cpu_s": cpu, "sample_sleep_s": wait}
    fault = ()
    if shape != "steady":
        cpu = _r(min(cpu, 0.3 * t), 5)
        target.update(sample_cpu_s=cpu, sample_sleep_s=0.0)
        fault = (("SleepSchedule", dict(_schedule(rng, d["duration"]), sleep_s=_r(t - cpu, 5),
                                       shape=shape)),)
    note = ("too few workers (%s): %d workers, %.1f ms a sample (%.1f of CPU, the rest waiting), "
            "%.2fx the step of %.0f ms" % (shape, w, t * 1000, cpu * 1000, s, c * 1000))
    return dict(shape=shape, severity=s, spare_cores=True, cache="none", target=target, fault=fault,
                note=note)


def _cpu_throttle(rng, d):
    w, s = rng.randint(1, 4), _severity(rng)
    shape = _shape(rng, "steady", "steady", "bursty", "ramping")
    need = rng.uniform(0.2, 0.7)  # cores the loader needs at the job's pace
    quota = _r(max(0.03, need / s), 3)
    cpu = _r(need * d["compute_s"] / d["batch_size"], 5)
    target = {"workers": w, "sample_cpu_s": cpu, "sample_sleep_s": 0.0}
    if shape == "steady":
        fault = (("CpuQuota", {"cpus": quota}),)
    else:
        fault = (("QuotaSchedule", dict(_schedule(rng, d["duration"]), cpus=quota, shape=shape,
                                        start=_r(2 * need, 3))),)
    note = ("cpu throttle (%s): %d workers need %.2f cores at the job's pace under a %.2f-CPU quota"
            % (shape, w, need, quota))
    return dict(shape=shape, severity=s, spare_cores=True, cache="none", target=target, fault=fault,
                note=note)


def _cpu_contention(rng, d):
    s = _severity(rng)
    b, c = d["batch_size"], d["compute_s"]
    if rng.random() < 0.5:  # busy processes crowd the one CPU the workers run on
        w = rng.randint(1, 4)
        hogs = min(6, max(1, math.ceil(w * (s / 0.85 - 1))))
        need = min(0.85, s * w / (w + hogs))
        fault = (("CpuHogs", {"hogs": hogs}),)
        how = "%d busy processes on their CPU" % hogs
    else:  # the workers' own CPU work holds every core (collate-saturated)
        w = rng.randint(3, 8)
        need = min(0.8 * w, 1.6 * s)
        fault = ()
        how = "no spare core"
    cpu = _r(need * c / b, 5)
    note = "cpu contention: %d workers need %.2f cores at the job's pace, %s" % (w, need, how)
    return dict(shape="steady", severity=s, spare_cores=False, cache="none",
                target={"workers": w, "sample_cpu_s": cpu, "sample_sleep_s": 0.0}, fault=fault, note=note)


def _storage_latency(rng, d):
    w, s = rng.randint(1, 8), _severity(rng)
    shape = _shape(rng, "steady", "bursty")
    lat = _r(min(0.25, s * d["compute_s"] * w / (FUSE_OPS_PER_SAMPLE * d["batch_size"])), 5)
    if shape == "steady":
        fault = (("SlowFuse", {"latency": lat, "tail_every": 0, "timed": False}),)
    else:
        sch = _schedule(rng, d["duration"])
        fault = (("SlowFuse", {"latency": 0.0005, "tail_every": 0, "timed": False,
                               "brownouts": [sch["period"], sch["on"], lat]}),)
    note = "storage latency (%s): a FUSE mount adds %.1f ms an operation; %d workers" % (
        shape, lat * 1000, w)
    return dict(shape=shape, severity=s, spare_cores=True, cache="none",
                target={"workers": w, "sample_sleep_s": 0.0}, fault=fault, note=note)


def _fuse_unhealthy(rng, d):
    w = rng.randint(1, 8)
    at = _r(rng.uniform(0.2, 0.45), 3)
    lat = _r(rng.uniform(0.0005, 0.003), 5)
    if rng.random() < 0.5:
        shape, kind, severity = "hang", ("FrozenFuse", {"latency": lat, "freeze_at": at}), None
        note = "fuse unhealthy: the FUSE daemon is frozen (SIGSTOP) at %.0f%% of the run; %d workers" % (
            100 * at, w)
    else:
        # a dead mount: each read fails, is retried twice 0.1 s apart, and the sample skipped
        # (sources.FileSource): 0.2 s a sample; fewer workers where that alone would keep up
        w = max(1, min(w, int(d["batch_size"] * 0.2 / (1.3 * d["compute_s"]))))
        shape, kind = "dead", ("DeadFuse", {"latency": lat, "kill_at": at})
        severity = _r(d["batch_size"] * 0.2 / (w * d["compute_s"]), 3)
        note = "fuse unhealthy: the FUSE daemon is killed at %.0f%% of the run; %d workers" % (100 * at, w)
    return dict(shape=shape, severity=severity, spare_cores=True, cache="none",
                target={"workers": w, "sample_sleep_s": 0.0}, fault=(kind,), note=note)


def _shm_exhaustion(rng, d):
    w = rng.randint(2, 4)
    kib = rng.choice((96, 128, 192, 256))
    batch_mib = d["batch_size"] * kib / 1024
    # room for 1.3-2.5 batches (MiB, whole): fewer than the loader keeps in flight
    # (2 x workers) and the one the loop holds (faults/shm.py TinyShm)
    free = max(math.ceil(1.2 * batch_mib), round(rng.uniform(1.3, 2.5) * batch_mib))
    size = next(s for s in (16, 32, 64, 128) if free + 4 <= s)
    note = ("shm exhaustion: /dev/shm of %d MiB, %d MiB free (%.1f batches of %d x %d KiB); %d workers"
            % (size, free, free / batch_mib, d["batch_size"], kib, w))
    return dict(shape="steady", severity=None, spare_cores=True, cache="none",
                target={"workers": w, "sample_sleep_s": 0.0},
                fault=(("TinyShm", {"size_mib": size, "leftover_mib": size - free, "sample_kib": kib}),),
                note=note)


def _bandwidth_bound(rng, d):
    w, s = rng.randint(1, 8), _severity(rng)
    b, c = d["batch_size"], d["compute_s"]
    # the job's need 2-30 MB/s: the store behind the link must outrun its cap
    fits = [k for k in (16, 32, 64, 128, 256, 512) if 2e6 <= b * k * 1024 / c <= 30e6] or [64]
    kib = rng.choice(fits)
    need = b * kib * 1024 / c
    rate = _r(need / s, 0)
    note = ("bandwidth bound: %d KiB a sample over a link shaped to %.2f MB/s "
            "(the job needs %.2f); %d workers" % (kib, rate / 1e6, need / 1e6, w))
    return dict(shape="steady", severity=s, spare_cores=True, cache="none",
                target={"workers": w, "sample_sleep_s": 0.0},
                fault=(("ShapedStore", {"rate": rate, "read_kib": kib, "timed": False}),), note=note)


def _checkpoint_contention(rng, d):
    w, s = rng.randint(1, 3), _severity(rng)
    c = d["compute_s"]
    burst = rng.uniform(2.5, 4.5)  # seconds of writing at 100 MB/s
    mib, every = int(burst * 100e6 / (1 << 20)), _r(burst + rng.uniform(5.0, 8.0), 2)
    # The loader's queue (prefetch 2 x workers batches, and one in the making a worker)
    # carries it through a short slowdown: during a burst it must fall behind by the queue
    # and then by the wait drawn, 4 % of the period severity times over; it then delivers
    # 1 / slow of the need: burst x (1 - 1 / slow) = the queue's time + that wait
    behind = min(0.95, (3 * w * c + 0.04 * s * every) / burst)
    slow = 1 / (1 - behind)
    extra = _r(min(0.25, slow * c * w / (FUSE_OPS_PER_SAMPLE * d["batch_size"])), 5)
    note = ("checkpoint contention: %d MiB written every %.1fs at 100 MB/s; the rank's FUSE reads "
            "take %.1f ms more while the disk writes; %d workers" % (mib, every, extra * 1000, w))
    return dict(shape="bursty", severity=s, spare_cores=True, cache="none",
                target={"workers": w, "sample_sleep_s": 0.0},
                fault=(("SlowFuse", {"latency": 0.0005, "tail_every": 0, "timed": False,
                                     "contention": [extra, 100e6]}),
                       ("DiskCheckpoints", {"mib": mib, "every": every, "mbps": 100.0})), note=note)


def _cache_miss(rng, d):
    w, s = rng.randint(1, 4), _severity(rng)
    lat = _r(min(0.2, s * d["compute_s"] * w / d["batch_size"]), 4)
    every = rng.randint(2, 4)
    note = ("cache miss: every rank reads through a local cache in front of a %.0f ms object store; "
            "the target's holds 1 shard in %d; %d workers" % (lat * 1000, every, w))
    return dict(shape="bursty", severity=s, spare_cores=True, cache="cold",
                everyone={"workers": w}, target={"sample_sleep_s": 0.0},
                fault=(("ColdCache", {"latency": lat, "cached_every": every, "timed": False}),), note=note)


def _transfer_cost(rng, d):
    w, s = rng.randint(1, 6), _severity(rng)
    # ~80 us a tensor to take over (file_descriptor sharing, lab/job.py): N of them a batch
    tensors = int(min(512, max(48, 375 * s * d["compute_s"])))
    note = "transfer cost: %d tensors a batch to take over one file descriptor at a time; %d workers" % (
        tensors, w)
    return dict(shape="steady", severity=s, spare_cores=True, cache="none",
                target={"workers": w, "tensors_per_sample": tensors, "sample_sleep_s": 0.0,
                        "sharing_strategy": "file_descriptor"}, fault=(), note=note)


_DRAWS = {"healthy": _healthy, "too_few_workers": _too_few_workers, "cpu_throttle": _cpu_throttle,
          "cpu_contention": _cpu_contention, "storage_latency": _storage_latency,
          "fuse_unhealthy": _fuse_unhealthy, "shm_exhaustion": _shm_exhaustion,
          "bandwidth_bound": _bandwidth_bound, "checkpoint_contention": _checkpoint_contention,
          "cache_miss": _cache_miss, "transfer_cost": _transfer_cost}
assert set(_DRAWS) == set(CLASSES)
for _c in CLASSES:
    if _c != "healthy":
        vocabulary.cause(_c)  # a KeyError at import for a class that is not a cause


def draw(seed, klass=None):
    """The draw of ``seed``: its class drawn from the seed unless given, its parameters
    from the seed and the class."""
    if klass is None:
        klass = random.Random("stallscope-class/%d" % seed).choice(CLASSES)
    if klass not in _DRAWS:
        raise ValueError("no fault class %r; known: %s" % (klass, ", ".join(CLASSES)))
    rng = random.Random("stallscope-draw/%d/%s" % (seed, klass))
    common = {"ranks": rng.randint(1, 4), "batch_size": rng.choice(BATCH),
              "compute_s": _r(rng.uniform(*STEP_S), 3), "duration": _r(rng.uniform(*DURATION_S), 1)}
    got = _DRAWS[klass](rng, common)
    everyone = dict(got.pop("everyone", {}), batch_size=common["batch_size"], compute_s=common["compute_s"])
    return Draw(seed=seed, klass=klass, cause=None if klass == "healthy" else klass,
                ranks=common["ranks"], duration=common["duration"], everyone=everyone,
                fault=tuple((n, dict(kw)) for n, kw in got.pop("fault")), **got)
