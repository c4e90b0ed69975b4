"""The ``stallscope lab ...`` and ``stallscope demo`` commands (cli.py parses and calls these).

Exit codes: 0 the run found what was expected; 1 it did not, or the run failed; 2 the
machine lacks what the scenario needs (one line says what); 128+N when stopped by
signal N, after everything was cleaned up.
"""
import json
import sys

from ..processes import teardown
from . import runner, scenarios
from .report import render


def _err(msg):
    print("stallscope lab: %s" % msg, file=sys.stderr, flush=True)


def _state(s):
    if s.real is None:
        return "synthetic only (syn-%s.json)" % s.name
    reason = s.make_fault().missing()
    return "ready" if not reason else "unavailable: " + reason


def list_scenarios():
    for s in scenarios.SCENARIOS:
        print("%-22s %-22s %s" % (s.name, s.cause or "(no stall)", _state(s)))
        print("%-22s %s" % ("", s.title))
    return 0


def _one(name, opts, apply_fix=False):
    """(exit code, result or None) of one scenario run; prints errors as one line."""
    try:
        scenario = scenarios.get(name)
        if apply_fix:
            from . import applyfix
            return None, applyfix.run(scenario, opts, runner.run)
        return None, runner.run(scenario, opts)
    except ValueError as e:
        _err(str(e))
        return 2, None
    except runner.Unavailable as e:
        _err(str(e))
        return 2, None
    except teardown.Interrupted as e:
        _err("interrupted by %s; everything the run created was removed" % e)
        return e.exit_code, None
    except (RuntimeError, TimeoutError, OSError) as e:
        _err("%s failed: %s" % (name, str(e).strip()))
        return 1, None
    except Exception as e:  # a bug: still one line, and everything was cleaned up
        _err("%s failed: internal error: %s: %s" % (name, type(e).__name__, e))
        return 1, None


def run(name, ranks, duration, keep, record, as_json, prometheus, workdir, apply_fix=False):
    opts = runner.Options(ranks=ranks, duration=duration, keep=keep, record=record,
                          prometheus=prometheus, workdir=workdir)
    code, result = _one(name, opts, apply_fix)
    if result is None:
        return code
    if as_json:
        print(json.dumps(result, indent=1, default=str))
    elif not keep:
        sys.stdout.write(render(result))
        if apply_fix:
            from . import applyfix
            sys.stdout.write(applyfix.render(result["fix"]))
    if apply_fix and not (result.get("fix") or {}).get("stall_gone"):
        return 1
    return 0 if result["ok"] else 1


def scoreboard_cmd(names, ranks, duration, as_json, prometheus, record, apply_fix=False):
    from .scoreboard import scoreboard

    return scoreboard(names or [s.name for s in scenarios.REAL], ranks, duration,
                      as_json, prometheus, record, apply_fix)


def demo(name, duration):
    from .demo import demo as _demo

    return _demo(name, duration)
