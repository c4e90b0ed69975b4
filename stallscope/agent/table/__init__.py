"""The hook-fed rank table: reports come in on the hook socket, are validated, and fold
into the state of each live rank on the node; the sample store keeps the node's own
signals beside it. Every history here is a ring sized before the first report
(budget.py).

- ingest.py       the hook socket's listener: one selector thread, a sender per connection
- validate.py     a hook message checked, typed (host/report.py HookReport), or a counted reject
- state.py        the rank table: admits a report (identity/admission.py), then folds it;
                  what the parts read of it
- rankstate.py    one rank's state: identity, PIDs, loader settings, histograms, timeline
- batches.py      a rank's batch timeline (the report's int64 columns: host/report.py)
- histogram.py    a Prometheus histogram accumulated in nanoseconds
- held.py         workers' reports that come before their trainer's first
- samples.py      bounded timelines of the node's own signals (the sample store)
- budget.py       the agent's memory ceiling, from --max-ranks and --timeline-seconds

Imports: the identity room (who a sender is), stallscope.host, .system, .correlate's
pure types (waitbins), .vocabulary, .hook's wire; never web/ or parts/.
"""
