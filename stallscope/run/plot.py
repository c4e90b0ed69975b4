"""The timeline plot of ``stallscope run``'s HTML report: the worst rank's data-wait
over the run, in percent of step time on a percent axis, with its running mean (the
per-bin share swings between 0 and 100 % around each stall; the mean is the level a
reader compares with the alert line and with the headline's figure), GPU busy where
NVML gave samples. From the run's agent's timeline of the rank; x is seconds since
the rank's first batch of the window. matplotlib is imported only here."""
from .. import figure
from ..diagnose import fetch, node
from ..figure import PlotError as PlotError  # what callers catch: the one error of figure.py

MEAN_SECONDS = 5.0  # the running mean's trailing window
MIN_BIN_S = 0.2


def shares(batches, width_s):
    """(bin starts in seconds from the first wait's start, data-wait share per bin):
    each batch's wait spread over the bins it overlaps."""
    import numpy as np

    end = np.array([b["t_end_ns"] for b in batches], dtype=np.int64)
    wait = np.array([b["wait_ns"] for b in batches], dtype=np.int64)
    t0, t1 = int((end - wait).min()), int(end.max())
    width = int(width_s * 1e9)
    n = max(1, -(-(t1 - t0) // width))
    waited = np.zeros(n)
    for s, e in zip(end - wait, end):
        i = int((s - t0) // width)
        while i < n and t0 + i * width < e:
            lo, hi = max(s, t0 + i * width), min(e, t0 + (i + 1) * width)
            if hi > lo:
                waited[i] += hi - lo
            i += 1
    return np.arange(n) * width_s, waited / width, t0


def running_mean(share, width_s, mean_s=MEAN_SECONDS):
    """The trailing mean of ``share`` over ``mean_s`` (fewer bins at the start)."""
    import numpy as np

    k = max(1, int(round(mean_s / width_s)))
    c = np.cumsum(np.concatenate([[0.0], share]))
    idx = np.arange(1, len(share) + 1)
    lo = np.maximum(0, idx - k)
    return (c[idx] - c[lo]) / (idx - lo)


def write(path, found, window_s):
    """The plot of ``found`` (the run's diagnose Report, diagnose/document.py) to ``path``."""
    figure.pyplot()  # matplotlib missing: say so before asking the agent
    try:
        tl = node.timeline(found.agent_url, found.rank, found.job, found.pod, window_s)
    except fetch.SourceError as e:
        raise PlotError("no timeline from the agent: %s" % e.message) from None
    batches = (tl or {}).get("batches") or []
    if not batches:
        raise PlotError("no batches in the window")
    width = max(MIN_BIN_S, window_s / 300.0)
    x, share, t0 = shares(batches, width)
    with figure.drawn(path) as (_fig, ax):
        from matplotlib.ticker import PercentFormatter

        ax.fill_between(x, 100 * share, step="post", color="tab:red", alpha=0.45,
                        label="data-wait (%% of each %.1fs)" % width)
        ax.plot(x + width, 100 * running_mean(share, width), color="darkred", lw=1.8,
                label="running mean (%gs)" % MEAN_SECONDS)
        gpu = (tl.get("signals") or {}).get("gpu_busy_ratio") or []
        if gpu:
            ax.plot([(t - t0) / 1e9 for t, _ in gpu], [100 * v for _, v in gpu], color="tab:green",
                    lw=1.2, drawstyle="steps-pre", label="GPU busy")
        line = found.threshold
        if line is not None:
            ax.axhline(100 * line, color="grey", ls=":", lw=1, label="alert line (%.1f%%)" % (100 * line))
        ax.set_ylim(0, 105)
        ax.yaxis.set_major_formatter(PercentFormatter(100))
        ax.set_ylabel("share of time")
        ax.set_xlabel("seconds since the window's first batch")
        ax.set_title("rank %s of job %s: data-wait %s over the window (%s)" % (
            found.rank, found.job, "n/a" if found.data_wait_ratio is None
            else "%.1f%%" % (100 * found.data_wait_ratio), found.verdict))
        ax.legend(loc="upper right", fontsize=8)
    return path
