"""Shared fixtures: a real agent process and a real Prometheus. Everything else the
tests share (skip rules, builders, trainers) is a plain import from tests/helpers/."""
import os

import pytest

from stallscope.processes.children import child_env
from stallscope.processes.servers import AgentProcess, PrometheusProcess
from tests.helpers.needs import need_prometheus


@pytest.fixture
def agent_factory(tmp_path):
    started = []

    def make(*args, env=None):
        a = AgentProcess(args=args, workdir=str(tmp_path / ("agent%d" % len(started))), env=env)
        os.makedirs(a.dir, exist_ok=True)
        started.append(a)
        return a.start()

    yield make
    for a in started:
        a.stop()


@pytest.fixture
def agent(agent_factory):
    return agent_factory()


@pytest.fixture
def prometheus_factory(tmp_path):
    need_prometheus()
    started = []

    def make(targets, rule_files=(), interval="1s"):
        d = tmp_path / ("prom%d" % len(started))
        d.mkdir()
        p = PrometheusProcess(targets, rule_files=rule_files, interval=interval, workdir=str(d))
        started.append(p)
        return p.start()

    yield make
    for p in started:
        p.stop()


@pytest.fixture
def hook_env(tmp_path):
    """Environment for a training subprocess reporting to a given agent."""
    def make(agent, **extra):
        return child_env(dict({k: str(v) for k, v in extra.items()}, STALLSCOPE_SOCKET=agent.socket))
    return make
