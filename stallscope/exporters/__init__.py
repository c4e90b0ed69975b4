"""Node exporters: one module per node signal (cfs, psi, shm, fuse, workers ...),
registered in registry.py, run by runner.py off the scrape path, attributed to ranks
through their PIDs' cgroups (cgroups.py).

The agent wires them with one call: ``exporters.install(agent)``.
"""
from . import base, registry, runner


def build(ctx, options, deadline, ranks, stopping=None):
    """A Runner over the exporters that ``options`` enables."""
    chosen = []
    for entry in registry.EXPORTERS:
        flag = options.get("exporter_" + entry.name)
        if flag is False or (flag is None and not entry.default):
            continue
        chosen.append((entry.name, registry.load(entry)(ctx), flag is True))
    return runner.Runner(ctx, chosen, deadline, ranks, stopping)


def install(agent):
    """Register the exporters' collector, schedule their collections and add
    ``/api/v1/exporters``. Returns the Runner."""
    opts = agent.config.options
    interval = float(opts.get("exporter_interval") or 2.0)
    deadline = float(opts.get("exporter_timeout") or 2.0)
    ctx = base.Context.of_agent(agent, deadline)
    run = build(ctx, opts, deadline, agent.table.snapshot, agent.stopping)
    for slot in run.slots:  # exporters that need more of the agent (hook keys, timeline parts)
        attach = getattr(slot.exporter, "attach", None)
        if attach is not None:
            attach(agent)
    agent.registry.register(run)
    agent.every(interval, run.tick)
    agent.add_route("/api/v1/exporters", lambda _agent, query: _status_route(run, query))
    return run


def _status_route(run, query):
    from ..agent.http import ApiError

    if query:
        raise ApiError(400, "unknown parameters: %s" % ", ".join(sorted(query)))
    return 200, {"exporters": run.status()}
