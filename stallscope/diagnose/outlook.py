"""What the fix will buy and what the stall costs now (issue 17), for the report:

- ``prediction``: the top cause's, from the agent's correlator (correlate/predict.py),
  when the verdict is the agent's;
- ``headroom``: the most any input-side fix can give, for the rank (its step with no
  wait) and for the job (in synchronous training the job moves at the straggler's pace,
  so the job's step shrinks by the straggler's waiting share);
- ``cost``: accelerator time idle on input wait. Every rank of a synchronous job idles
  while the straggler waits, so the job loses world size x the straggler's waiting
  share of its wall time; the rank alone, its own share. The same quantity the
  recording rule ``job:stallscope_idle_accelerators:max_rate5m`` gives Prometheus.
- ``change``: a loader-setting or CPU-limit change the agent marked, with before ->
  after against the prediction made before it (correlate/change.py).
"""

DAY_HOURS = 24.0


def _speedup(ratio):
    return round(1.0 / (1.0 - ratio), 3) if ratio is not None and ratio < 1 else None


def headroom(doc, diag):
    rank = dict((diag or {}).get("headroom") or {})
    if not rank and doc.get("data_wait_ratio") is not None:
        rank = {"data_wait_ratio": doc["data_wait_ratio"], "speedup": _speedup(doc["data_wait_ratio"])}
    job = None
    if doc.get("job_max_data_wait_ratio") is not None:
        job = {"data_wait_ratio": doc["job_max_data_wait_ratio"],
               "speedup": _speedup(doc["job_max_data_wait_ratio"]), "scope": doc.get("job_scope")}
        if rank.get("step_seconds"):
            job["step_seconds_without_wait"] = round(
                rank["step_seconds"] * (1 - doc["job_max_data_wait_ratio"]), 6)
    return {"rank": rank or None, "job": job}


def cost(doc):
    """Idle accelerators now: {world_size, waiting_share, idle_accelerators, gpu_hours_per_day,
    rank_gpu_hours_per_day, cause}."""
    share, world = doc.get("job_max_data_wait_ratio"), doc.get("job_ranks")
    if share is None or not world:
        return None
    idle = world * share
    causes = [c for c in doc.get("causes") or [] if c.get("score", 0) > 0]
    mine = doc.get("data_wait_ratio")
    return {"world_size": world, "waiting_share": round(share, 6),
            "idle_accelerators": round(idle, 4), "gpu_hours_per_day": round(idle * DAY_HOURS, 3),
            "rank_gpu_hours_per_day": round(mine * DAY_HOURS, 3) if mine is not None else None,
            "scope": doc.get("job_scope"),
            "cause": causes[0]["cause"] if causes and doc.get("verdict") == "input_bound" else None}


def of(doc, diag):
    out = {"prediction": (diag or {}).get("prediction") if doc.get("verdict") == "input_bound" and
           diag is not None and diag.get("verdict") == doc.get("verdict") else None,
           "headroom": headroom(doc, diag), "cost": cost(doc)}
    if (diag or {}).get("change"):
        out["change"] = diag["change"]
    return out


def lines(doc):
    """The report's lines for prediction, headroom, cost and a marked change."""
    out = []
    p = doc.get("prediction")
    if p:
        out.append("Prediction (%s, confidence %s): %s -> data-wait %.1f%%, step %.3gs (x%s faster)" % (
            p.get("cause"), p.get("confidence"), p["change"], 100 * p["predicted_data_wait_ratio"],
            p["predicted_step_seconds"], p.get("speedup")))
        out.append("  basis: %s" % p.get("basis"))
    h = doc.get("headroom") or {}
    r, j = h.get("rank") or {}, h.get("job") or {}
    if r.get("speedup") or j.get("speedup"):
        text = "Headroom (every input wait gone):"
        if r.get("step_seconds_without_wait"):
            text += " rank step %.3gs -> %.3gs (x%s);" % (r["step_seconds"], r["step_seconds_without_wait"],
                                                          r["speedup"])
        elif r.get("speedup"):
            text += " rank x%s;" % r["speedup"]
        if j.get("speedup"):
            text += " job x%s (the straggler waits %.1f%%)" % (j["speedup"], 100 * j["data_wait_ratio"])
        out.append(text.rstrip(";"))
    c = doc.get("cost")
    if c and c["waiting_share"] > 0:
        text = ("Cost now: this stall costs %.1f GPU-hours a day (%d ranks x %.1f%% waiting%s)" % (
            c["gpu_hours_per_day"], c["world_size"], 100 * c["waiting_share"],
            ", this node's ranks only" if c.get("scope") == "node" else ""))
        if c.get("cause"):
            text += ", attributed to %s" % c["cause"]
        out.append(text + ".")
    ch = doc.get("change")
    if ch:
        out.append(change_line(ch))
    return out


def change_line(ch):
    b, a = ch.get("before") or {}, ch.get("after") or {}
    text = "Change at %s: %s. Before -> after: data-wait %s -> %s, step %s -> %s" % (
        ch.get("at_wall", "?"), ch.get("what"), _pc(b.get("data_wait_ratio")), _pc(a.get("data_wait_ratio")),
        _s(b.get("step_seconds")), _s(a.get("step_seconds")))
    p = ch.get("predicted")
    if p:
        text += " (predicted %s, step %s)" % (_pc(p.get("predicted_data_wait_ratio")),
                                              _s(p.get("predicted_step_seconds")))
    text += "; the stall is %s." % ("gone" if ch.get("stall_gone") else "still there")
    return text


def _pc(x):
    return "n/a" if x is None else "%.1f%%" % (100 * x)


def _s(x):
    return "n/a" if x is None else "%.3gs" % x
