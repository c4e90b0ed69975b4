"""Processes a stallscope command starts and must not leave behind: children in their own
session that die with their parent and are stopped by group (``children``), the agent and
Prometheus as real servers on free ports (``servers``), and the stack that undoes what a
run made whatever ends it (``teardown``). Shared by the lab and ``stallscope run``; it
imports neither."""
