"""The part contract: what everything the agent hosts is (``Part``) and what it may use
(``Host``, a narrow view of the agent), typed options that become flags, and metric
families built from the vocabulary. Parts (the hook-fed state, the exporters, the GPU,
the correlator) import this package, never ``stallscope.agent``: the agent's
composition root (agent/main.py) is the only module that knows them all.
"""
from .contract import ApiError, Host, Part, Query, Rank, Route, log, one
from .report import HookReport

__all__ = ["ApiError", "HookReport", "Host", "Part", "Query", "Rank", "Route", "log", "one"]
