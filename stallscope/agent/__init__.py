"""The node agent (``stallscope agent``): one process a node, fed by the hook in every
training process over a unix socket, scraped by Prometheus, asked by ``stallscope
diagnose`` over HTTP. Its modules live in four rooms, below the composition:

- main.py       the composition root: the only module that knows every part (and the
                exporters); builds the rooms' objects and wires them
- options.py    the flags of ``stallscope agent``, from each part's typed options
- host.py       the agent's side of the part contract (stallscope/host/): the ``Host``
                every part receives and the fan-out of reports, ticks and scrapes
- api.py        the core JSON routes (/api/v1/ranks, /api/v1/timeline, /api/v1/agent)
                over the host's parts
- malloc.py     glibc's allocator settings for a long-running daemon

- web/          HTTP: the bounded server, its wire, its pool, the /metrics text format
- identity/     who sent a report, from the kernel and the kubelet, never the message
- table/        the hook-fed rank table: the socket's intake, validation, each rank's
                state and the sample store, under one memory budget
- parts/        the hook-fed parts (ranks, loader, shards) and the analysis parts
                (correlator, hangs) the host fans reports, ticks and scrapes out to

What may import what (tests/layout/test_imports.py): a room never imports a module of
this level (main, options, host, api, malloc) and the rooms import in one direction
only, parts -> table -> identity, parts -> web; web and identity import no other room.
Only main.py and options.py import the exporters.
"""
