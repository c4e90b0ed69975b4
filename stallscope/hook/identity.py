"""Who is this training process: rank, job, pod, node, found from the environment.

torchrun sets RANK/LOCAL_RANK/WORLD_SIZE and TORCHELASTIC_RUN_ID; Slurm sets
SLURM_PROCID/SLURM_LOCALID/SLURM_NTASKS and SLURM_JOB_ID; Kubernetes gives the pod name
as HOSTNAME and, through the downward API, POD_NAME/POD_NAMESPACE/NODE_NAME.
Anything can be overridden by keyword in ``stallscope.watch(loader, rank=..., job=...)``.
"""
from __future__ import annotations

import os
import socket

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, Union

    # job, pod, namespace, node: str; rank, local_rank, world_size: int
    Ident = dict[str, Union[str, int]]

FIELDS = ("job", "rank", "local_rank", "world_size", "pod", "namespace", "node")
_INT_FIELDS = ("rank", "local_rank", "world_size")
_SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _first(env: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = env.get(name)
        if value:
            return value
    return None


def _int(value: Any, default: int | str) -> int | str:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _namespace(env: Mapping[str, str]) -> str:
    ns = env.get("POD_NAMESPACE")
    if ns:
        return ns
    try:
        with open(_SA_NAMESPACE) as f:
            return f.read().strip()
    except OSError:
        return ""


def detect(env: Mapping[str, str] | None = None, **overrides: object) -> Ident:
    """Return the identity dict. Unknown override keys are ignored by the caller."""
    env = os.environ if env is None else env
    # An explicit STALLSCOPE_JOB wins; torchrun's run id defaults to the literal "none"
    # when --rdzv-id is not given, which names nothing, so it is skipped.
    run_id = env.get("TORCHELASTIC_RUN_ID")
    if run_id == "none":
        run_id = None
    job = env.get("STALLSCOPE_JOB") or run_id or env.get("SLURM_JOB_ID") or "default"
    ident: Ident = {
        "job": job,
        "rank": _int(_first(env, "RANK", "SLURM_PROCID"), 0),
        "local_rank": _int(_first(env, "LOCAL_RANK", "SLURM_LOCALID"), 0),
        "world_size": _int(_first(env, "WORLD_SIZE", "SLURM_NTASKS"), 1),
        "pod": _first(env, "POD_NAME", "HOSTNAME") or socket.gethostname(),
        "namespace": _namespace(env),
        "node": env.get("NODE_NAME") or "",
    }
    for key, value in overrides.items():
        if key in FIELDS and value is not None:
            ident[key] = _int(value, ident[key]) if key in _INT_FIELDS else str(value)
    return ident
