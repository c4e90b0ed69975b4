"""The agent's HTTP: /metrics, /healthz and the versioned JSON API on a bounded server.
Knows no rank and no part: routes come in as plain functions from above (api.py and the
parts' ``routes``).

- http.py         the HTTP face: routes, 400s with a reason, 500s naming the exception
- httpserver.py   the selector loop that accepts, reads and writes, with its limits
- httpwire.py     a request head parsed from bytes, a response encoded to bytes (no I/O)
- httppool.py     the fixed worker pool, the inbox back to the loop, the counters
- exposition.py   the Prometheus text format, byte for byte what client_python writes
- scrapefirst.py  a render of /metrics goes before the correlator's loops over ranks
- healthd.py      the health responder: a process of its own (standard library only) that
                  holds the listening socket, answers /healthz from a shared page and hands
                  every other connection to the server unread

Imports: stallscope.host (log, ApiError) and each other; no other room of the agent.
"""
