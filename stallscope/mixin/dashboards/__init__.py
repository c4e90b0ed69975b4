"""The Grafana dashboards, built with grafana-foundation-sdk (the `dashboards` extra)."""
from . import fleet, node, overview


def all_dashboards(cfg):
    """[(file stem, dashboard JSON model)] in a fixed order."""
    return [("stallscope-overview", overview.build(cfg)), ("stallscope-node", node.build(cfg)),
            ("stallscope-fleet", fleet.build(cfg))]
