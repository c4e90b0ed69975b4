"""``/metrics`` families of the GPU signals, built from the samplers' in-memory state at
each collection of the ``gpu`` exporter (never calling NVML or dcgm-exporter itself).

Series per GPU carry ``gpu``, ``uuid``, ``source`` (nvml / simulated / dcgm) and the
rank labels of the rank it serves (job, rank, pod, namespace, node; empty but ``node``
when no rank is mapped; one series per rank when several ranks share a GPU). Per rank
that is 3 series against the per-rank budget: busy ratio, busy seconds, SM-active.
"""
from ...host.families import family


def _rank_labels(part, uuid, ranks, node):
    keys = part.mapping.ranks_of.get(uuid, ())
    out = [ranks[k].labels for k in keys if k in ranks]
    return out or [{"node": node}]


def families(part, rank_list):
    node = part.host.node
    ranks = {r.key: r for r in rank_list}
    busy = family("stallscope_gpu_busy_ratio")
    busy_s = family("stallscope_gpu_busy_seconds_total")
    up = family("stallscope_gpu_up")
    for gpu, status, ratio, busy_total, _sampled, _pids in part.tracks():
        base = {"gpu": str(gpu.index), "uuid": gpu.uuid, "source": gpu.source}
        up.add({"node": node}, 1 if status == "ok" else 0, **base)
        for lv in _rank_labels(part, gpu.uuid, ranks, node):
            if status == "ok" and ratio is not None:
                busy.add(lv, ratio, **base)
            busy_s.add(lv, busy_total, **base)
    sm = family("stallscope_gpu_sm_active_ratio")
    for r in part.readings().values():
        lvs = ([{"node": node}] if ":" in r.gpu else _rank_labels(part, r.uuid, ranks, node))
        for lv in lvs:
            sm.add(lv, r.value, gpu=r.gpu, uuid=r.uuid, source="dcgm", field=r.field)
    errors = family("stallscope_gpu_read_errors_total")
    for name, counts in ([(s.source.name, s.errors) for s in part.samplers]
                         + [("dcgm", part.dcgm.errors if part.dcgm else {}),
                            ("hook", part.rejected)]):
        for reason, n in sorted(dict(counts).items()):
            errors.add({}, n, source=name, reason=reason)
    return [f.family for f in (busy, busy_s, up, sm, errors)]
