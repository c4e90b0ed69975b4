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


def sample(seed, klass, count, record, prometheus, apply_fix, workdir, as_json):
    """``stallscope lab sample``: ``count`` draws from ``seed`` on (seeds seed, seed+1 ...),
    of class ``klass`` ("all": ``count`` of every class; None: the class drawn by the
    seed), each run live and scored; then the table per class. Exit 0 when every draw
    ran, 1 when one failed, 2 when none could run here."""
    from . import draws, sampler

    classes = list(sampler.CLASSES) if klass == "all" else [klass]
    rows = []
    for i in range(count):
        for c in classes:
            d = sampler.draw(seed + i, c)
            opts = runner.Options(record=record, prometheus=prometheus, workdir=workdir)
            row = {"class": d.klass, "seed": d.seed}
            try:
                doc = draws.run_draw(d, opts, apply_fix)
            except runner.Unavailable as e:
                row["skipped"] = str(e)
            except teardown.Interrupted as e:
                _err("interrupted by %s; everything the run created was removed" % e)
                return e.exit_code
            except (RuntimeError, TimeoutError, OSError) as e:
                row["skipped"] = "failed: %s" % (str(e).strip().splitlines() or [type(e).__name__])[0]
                row["failed"] = True
            except Exception as e:  # a bug: one line, and everything the draw made was removed
                row["skipped"] = "failed: internal error: %s: %s" % (type(e).__name__, e)
                row["failed"] = True
            else:
                row.update(scores=draws.fresh_scores(doc), fix=doc.get("fix"),
                           file=doc["recorded"].get("file"), wall_s=doc["recorded"]["wall_s"])
            rows.append(row)
            print(draws.detail([row], PATHS) + ("  (%ss)" % row["wall_s"] if "wall_s" in row else ""),
                  file=sys.stderr if as_json else sys.stdout, flush=True)
    if as_json:
        print(json.dumps(rows, indent=1, default=str))
    else:
        print("\nfresh draws (seeds %d-%d): top cause by each path, the rest by diagnose" % (
            seed, seed + count - 1))
        print(draws.table(rows, PATHS))
    if not any("scores" in r for r in rows):
        return 2 if all(not r.get("failed") for r in rows) else 1
    return 1 if any(r.get("failed") for r in rows) else 0


PATHS = ("diagnose", "agent", "prometheus", "replay")  # = draws.LIVE_PATHS
