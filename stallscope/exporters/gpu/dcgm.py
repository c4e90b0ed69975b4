"""SM-active per GPU from a dcgm-exporter ``/metrics`` endpoint.

``DCGM_FI_PROF_SM_ACTIVE`` (the share of cycles an SM has a warp resident, averaged over
all SMs) is the honest "is the GPU computing" signal: one busy SM of 132 reads ~100 %
in GPU_UTIL but 0.008 in SM_ACTIVE. It is commented out in dcgm-exporter's shipped
counter files, so fall back to ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (enabled in
dcp-metrics-included.csv; the share of time a context is active), then to
``DCGM_FI_DEV_GPU_UTIL`` (percent). The ``field`` label says which one was used.

Format (dcgm-exporter's README and etc/*.csv): one gauge per field, labels ``gpu``,
``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``Hostname`` (``hostname`` in newer
builds), label-type fields such as ``DCGM_FI_DRIVER_VERSION``, MIG's ``GPU_I_PROFILE``
/ ``GPU_I_ID``, and with Kubernetes mapping on ``container``, ``namespace``, ``pod``.
DCGM's "blank" sentinels (e.g. 140737488355328 for a double, 9223372036854775794 for
"not supported") show up as values: anything outside the field's range is dropped.

dcgm-exporter collects every ``-c`` milliseconds (30 s by default); reading it faster
returns the same values, so a scrape identical to the previous one is not a new sample.
"""
import collections
import math
import sys
import threading
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

FIELDS = (("DCGM_FI_PROF_SM_ACTIVE", 1.0), ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1.0),
          ("DCGM_FI_DEV_GPU_UTIL", 100.0))
_SCALE = dict(FIELDS)
MAX_BYTES = 16 << 20

Reading = collections.namedtuple("Reading", "uuid gpu field value namespace pod container model")


def parse(text):
    """Exposition text → {(uuid, gpu): Reading}, one per GPU (or MIG instance), the best
    available field each."""
    found = collections.defaultdict(dict)  # (uuid, gpu) -> {field: Reading}
    for family in text_string_to_metric_families(text):
        scale = _SCALE.get(family.name)
        if scale is None:
            continue
        for s in family.samples:
            labels = s.labels
            uuid = labels.get("UUID") or labels.get("uuid")
            value = s.value / scale
            if not uuid or math.isnan(value) or not 0.0 <= value <= 1.0:
                continue
            gpu = labels.get("gpu", "")
            if labels.get("GPU_I_ID"):  # a MIG instance: one series per instance
                gpu = "%s:%s" % (gpu, labels["GPU_I_ID"])
            found[(uuid, gpu)][family.name] = Reading(
                uuid, gpu, family.name, value, labels.get("namespace", ""),
                labels.get("pod", ""), labels.get("container", ""), labels.get("modelName", ""))
    out = {}
    for key, fields in found.items():
        for name, _ in FIELDS:
            if name in fields:
                out[key] = fields[name]
                break
    return out


def _log(message):
    print("stallscope agent: gpu: %s" % message, file=sys.stderr, flush=True)


class DcgmReader:
    name = "dcgm"

    def __init__(self, url, interval=1.0, timeout=2.0, on_readings=None, log=_log):
        self.url = url
        self.interval = interval
        self.timeout = timeout
        self.on_readings = on_readings
        self.log = log
        self.lock = threading.Lock()
        self.readings = {}
        self.up = False
        self.reason = "not read yet"
        self.errors = collections.Counter()
        self.collections = 0  # distinct dcgm-exporter collections seen
        self.thread = None
        self._last = None
        self._said = set()

    def say_once(self, message):
        if message not in self._said:
            self._said.add(message)
            self.log(message)

    def fetch(self):
        req = urllib.request.Request(self.url, headers={"Accept": "text/plain"})
        with urllib.request.urlopen(req, timeout=self.timeout) as r:
            data = r.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            raise ValueError("response larger than %d bytes" % MAX_BYTES)
        return data.decode("utf-8", "replace")

    def poll(self):
        """One scrape. Never raises."""
        t_ns = time.monotonic_ns()
        try:
            text = self.fetch()
        except (OSError, ValueError, urllib.error.URLError) as e:
            reason = getattr(e, "reason", None) or e
            self._down("fetch", "dcgm-exporter at %s not reachable: %s" % (self.url, reason))
            return
        try:
            readings = parse(text)
        except Exception as e:
            self._down("parse", "dcgm-exporter at %s: unparsable exposition: %s" % (self.url, e))
            return
        if not readings:
            self._down("no_fields", "dcgm-exporter at %s reports none of %s" % (
                self.url, ", ".join(n for n, _ in FIELDS)))
            return
        with self.lock:
            self.readings, self.up, self.reason = readings, True, None
        signature = tuple(sorted((k, r.value) for k, r in readings.items()))
        if signature == self._last:
            return  # the same collection read again (dcgm-exporter's -c interval)
        self._last = signature
        self.collections += 1
        for r in readings.values():
            if r.field != FIELDS[0][0]:
                self.say_once("dcgm-exporter has no %s for %s; using %s (enable it in the "
                              "counters CSV, see docs/gpu.md)" % (FIELDS[0][0], r.uuid, r.field))
        if self.on_readings is not None:
            try:
                self.on_readings(readings, t_ns)
            except Exception as e:
                self.errors["sink_" + type(e).__name__] += 1

    def _down(self, kind, message):
        self.errors[kind] += 1
        with self.lock:  # stale readings must not pass for current ones
            self.readings, self.up, self.reason = {}, False, message
        self._last = None
        self.say_once(message)

    def snapshot(self):
        with self.lock:
            return self.up, dict(self.readings)

    def run(self, stopping):
        while not stopping.is_set():
            started = time.monotonic()
            self.poll()
            stopping.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def ensure_running(self, stopping):
        if not stopping.is_set() and (self.thread is None or not self.thread.is_alive()):
            self.thread = threading.Thread(target=self.run, args=(stopping,),
                                           name="stallscope-gpu-dcgm", daemon=True)
            self.thread.start()
