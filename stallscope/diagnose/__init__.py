"""``stallscope diagnose POD``: from the page to the cause in one command.

- cluster.py   the cluster view from Prometheus (job, rank, node; SLI vs the job's max
               and median; the slowest ranks; since when; the node's agent)
- node.py      the node detail from that agent (diagnosis, loader, PIDs, timeline)
- stacks.py    py-spy dumps of the main process and each worker; classify.py reads them
- verdict.py   one verdict, the causes and the evidence table from both views
- nextsteps.py runbooks and commands; report.py runs it all; render.py prints it;
               plot.py draws data-wait against GPU busy (matplotlib, only for --plot)

- document.py  the report's typed objects and its one JSON encoder (``--json``)

For other parts (the lab, the demo): ``run(...) -> Report``, ``render_text(Report) -> str``,
``encode(Report) -> dict`` (the --json document), ``exit_code(Report) -> int``;
``DiagnoseError`` carries the one-line reason for exit 2.
"""
from .document import Report, encode
from .errors import DiagnoseError
from .render import render_json, render_text
from .report import exit_code, run

__all__ = ["DiagnoseError", "Report", "encode", "exit_code", "render_json", "render_text", "run"]
