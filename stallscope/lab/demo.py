"""``stallscope demo``: one telling scenario end to end in about a minute, on any laptop.

The default scenario (too-few-workers) needs no root, FUSE or cgroup: one rank's
per-sample work is too slow for its 2 loader workers, so it stalls every 2 batches and,
through the all_reduce, holds the other rank back. The demo shows the live per-rank
data-wait, then what stallscope found; where Prometheus is installed, it also waits for
the headline alert to fire under the lab's short-window copy of the generated rules.
As root the two ranks run on two lab nodes (lab/nodes.py), each with its own network
namespace and agent, as in a cluster: the victim's agent never hears from the straggler.
"""
import sys
import textwrap

from ..processes import teardown
from . import nodes, runner, scenarios
from .report import render

INTRO = ("stallscope demo: a real 2-rank training job (torch.distributed, gloo) with real "
         "DataLoader workers, {agents}, {prom}and one injected stall. Nothing is "
         "installed or changed on this machine; everything is removed at the end (also on Ctrl-C).")
NODES = ("node-a", "node-b")


def demo(name=scenarios.DEMO, duration=None):
    import shutil

    prom = "a Prometheus server evaluating the alert rules, " if shutil.which("prometheus") else ""
    placed = NODES if nodes.isolated() and not scenarios.get(name).real.nodes else ()
    agents = ("two lab nodes (a network namespace each, on a bridge) with a stallscope agent each"
              if placed else "a stallscope agent")
    print(textwrap.fill(INTRO.format(prom=prom, agents=agents), 88) + "\n", file=sys.stderr, flush=True)
    opts = runner.Options(ranks=2, duration=duration or 40.0, nodes=placed)
    try:
        result = runner.run(scenarios.get(name), opts)
    except (runner.Unavailable, ValueError) as e:
        print("stallscope demo: %s" % e, file=sys.stderr)
        return 2
    except teardown.Interrupted as e:
        print("stallscope demo: interrupted by %s; everything it started was removed" % e, file=sys.stderr)
        return e.exit_code
    except (RuntimeError, TimeoutError, OSError) as e:
        print("stallscope demo: failed: %s" % str(e).strip(), file=sys.stderr)
        return 1
    sys.stdout.write(render(result))
    alerts = result.get("alerts")
    if alerts is None:
        print("\n(Install Prometheus to also see the StallscopeDataWaitHigh alert fire: "
              "apt-get install prometheus.)")
    return 0 if result["ok"] else 1
