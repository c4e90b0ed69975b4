"""Loaded by the soak's agent when ``soak_agent.py --trace DIR`` puts this folder on its
PYTHONPATH: tracemalloc (10 frames) from interpreter start, and a thread that writes what
grew since the first snapshot after warm-up (issue 14's memory plateau).

Every STALLSCOPE_TRACE_EVERY seconds after STALLSCOPE_TRACE_WARMUP, DIR/trace-<minute>.txt
gets: RSS and tracemalloc's total (their gap is memory Python does not allocate: numpy's
large buffers over the mmap threshold, malloc fragmentation); the top differences by
traceback; object counts by type that grew; and the lengths of the containers held by
stallscope objects (class.attribute), summed over instances, that grew.
"""
import os

DIR = os.environ.get("STALLSCOPE_TRACE_DIR")
if DIR:
    import collections
    import gc
    import threading
    import time
    import tracemalloc

    FRAMES = int(os.environ.get("STALLSCOPE_TRACE_FRAMES", "10"))
    if FRAMES:
        tracemalloc.start(FRAMES)
    WARMUP = float(os.environ.get("STALLSCOPE_TRACE_WARMUP", "240"))
    EVERY = float(os.environ.get("STALLSCOPE_TRACE_EVERY", "120"))
    T0 = time.monotonic()

    def _rss_mib():
        with open("/proc/self/status") as f:
            return int(next(line for line in f if line.startswith("VmRSS:")).split()[1]) / 1024

    def _types():
        return collections.Counter(type(o).__name__ for o in gc.get_objects())

    def _containers():
        sizes = collections.Counter()
        for o in gc.get_objects():
            cls = type(o)
            if not str(getattr(cls, "__module__", "")).startswith("stallscope") or isinstance(o, type):
                continue
            attrs = getattr(o, "__dict__", None) or {}
            for slot in getattr(cls, "__slots__", ()):
                if hasattr(o, slot):
                    attrs = dict(attrs, **{slot: getattr(o, slot)})
            for name, value in attrs.items():
                if isinstance(value, (dict, list, set, collections.deque)):
                    sizes["%s.%s" % (cls.__name__, name)] += len(value)
        return sizes

    def _allocators():
        """glibc's view (mallinfo2: heap bytes in arenas, mmapped, in use, free) and
        pymalloc's (arenas, bytes in blocks): where RSS goes that tracemalloc cannot see."""
        import ctypes
        import re
        import tempfile

        class MallInfo2(ctypes.Structure):
            _fields_ = [(n, ctypes.c_size_t) for n in (
                "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                "uordblks", "fordblks", "keepcost")]

        out = {}
        try:
            libc = ctypes.CDLL(None)
            libc.mallinfo2.restype = MallInfo2
            m = libc.mallinfo2()
            out.update(heap=m.arena / 2**20, mmapped=m.hblkhd / 2**20, in_use=m.uordblks / 2**20,
                       free=m.fordblks / 2**20)
        except (OSError, AttributeError):
            pass
        import sys
        with tempfile.TemporaryFile("w+") as tmp:
            saved = os.dup(2)
            sys.stderr.flush()
            os.dup2(tmp.fileno(), 2)
            try:
                sys._debugmallocstats()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            tmp.seek(0)
            text = tmp.read()
        for key, pattern in (("py_arenas", r"# arenas allocated current\s*=\s*([\d,]+)"),
                             ("py_blocks", r"# bytes in allocated blocks\s*=\s*([\d,]+)"),
                             ("py_free", r"# bytes in available blocks\s*=\s*([\d,]+)")):
            found = re.search(pattern, text)
            if found:
                v = int(found.group(1).replace(",", ""))
                out[key] = v if key == "py_arenas" else v / 2**20
        out["threads"] = threading.active_count()
        return out

    def _write(name, lines):
        with open(os.path.join(DIR, name), "w") as f:
            f.write("\n".join(lines) + "\n")

    def _loop():
        try:
            _reports()
        except Exception:
            import traceback
            _write("error.txt", [traceback.format_exc()])

    def _reports():
        time.sleep(WARMUP)
        gc.collect()
        base, types0, sizes0 = tracemalloc.take_snapshot(), _types(), _containers()
        base.dump(os.path.join(DIR, "base.snapshot"))
        prev = base
        series = ["minute rss_mib traced_mib"]
        while True:
            minute = (time.monotonic() - T0) / 60
            traced = tracemalloc.get_traced_memory()[0] / 2**20
            series.append("%.1f %.1f %.1f" % (minute, _rss_mib(), traced))
            _write("series.txt", series)
            time.sleep(EVERY)
            gc.collect()
            snap = tracemalloc.take_snapshot()
            minute = (time.monotonic() - T0) / 60
            lines = ["minute %.1f rss %.1f MiB traced %.1f MiB" % (
                minute, _rss_mib(), tracemalloc.get_traced_memory()[0] / 2**20), "", "# top by traceback"]
            for d in snap.compare_to(base, "traceback")[:15]:
                lines.append("%+.1f KiB (%+d blocks) now %.1f KiB" % (
                    d.size_diff / 1024, d.count_diff, d.size / 1024))
                lines.extend("    " + line for line in d.traceback.format()[-10:])
            lines += ["", "# top by line since the previous report"]
            for d in snap.compare_to(prev, "lineno")[:10]:
                lines.append("%+.1f KiB (%+d blocks) %s" % (d.size_diff / 1024, d.count_diff, d.traceback))
            prev = snap
            snap.dump(os.path.join(DIR, "snap-%05.1f.snapshot" % minute))
            lines += ["", "# object counts that grew"]
            grown = (_types() - types0).most_common(20)
            lines += ["%+d %s" % (n, t) for t, n in grown]
            lines += ["", "# stallscope containers (len, summed) that grew"]
            sizes = _containers()
            lines += ["%s %d -> %d" % (k, sizes0.get(k, 0), v) for k, v in sorted(sizes.items())
                      if v > sizes0.get(k, 0)]
            _write("trace-%05.1f.txt" % minute, lines)

    if FRAMES:
        threading.Thread(target=_loop, name="soak-trace", daemon=True).start()
    else:  # no tracemalloc: RSS, the allocators and the containers, cheaply
        def _untraced():
            time.sleep(WARMUP)
            sizes0 = _containers()
            _cheap_loop_with(sizes0)

        def _cheap_loop_with(sizes0):
            rows = []
            while True:
                row = dict(minute=(time.monotonic() - T0) / 60, rss=_rss_mib(), **_allocators())
                rows.append(" ".join("%s=%s" % (k, ("%.2f" % v) if isinstance(v, float) else v)
                                     for k, v in row.items()))
                sizes = _containers()
                rows += ["    %s %d -> %d" % (k, sizes0.get(k, 0), v) for k, v in sorted(sizes.items())
                         if v != sizes0.get(k, 0)]
                _write("allocators.txt", rows)
                time.sleep(EVERY)

        threading.Thread(target=_untraced, name="soak-trace", daemon=True).start()
