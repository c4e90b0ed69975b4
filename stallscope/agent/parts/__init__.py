"""The agent's own parts (stallscope.host.Part): what the host fans each report, tick,
scrape and API call out to. The node exporters are parts too, in stallscope/exporters.

- ranks.py          ``ranks``: the hook-fed core's series and the ingest's self-health
- loader.py         ``loader``: batch production and compute time, workers that keep up
- shards.py         ``shards``: shard reads and cache lookups, per pod and tier
- correlator.py     ``correlator``: the periodic, on-stall and on-demand analysis
- rerank.py         when a standing stall needs its causes ranked again (the correlator's
                    re-ranking schedule)
- settingswatch.py  changes of a rank's loader settings or quota, marked with the
                    prediction made before them
- hangs.py          ``hangs``: a rank blocked in next() triaged with py-spy

Imports: the table and web rooms, stallscope.host (the part contract), .correlate,
.diagnose, .system, .vocabulary; never main.py or another module above the rooms.
"""
