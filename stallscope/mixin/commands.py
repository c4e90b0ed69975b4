"""What ``stallscope alerts`` and ``stallscope dashboards`` do; cli.py only parses."""
import sys

from . import config as _config
from . import generate


def _fail(command, message, code=2):
    print("stallscope %s: %s" % (command, message), file=sys.stderr)
    return code


def _load(command, config_path):
    try:
        return _config.load(config_path), None
    except ValueError as e:
        return None, _fail(command, str(e))


def _finish(command, diffs, written, check):
    if check:
        if diffs:
            sys.stdout.write("\n".join(diffs) + "\n")
            return _fail(command, "%d file(s) differ from the generator; run `make generate`" % len(diffs), 1)
        print("stallscope %s: up to date" % command)
        return 0
    for path in written:
        print(path)
    return 0


def alerts(out, prometheusrule=None, config_path=None, check=False, inhibit_rules=None,
           alertmanagerconfig=None):
    cfg, err = _load("alerts", config_path)
    if err is not None:
        return err
    warning = _config.placeholder_warning(cfg)
    # a warning, not a failure (the files are right for the placeholder); not on --check,
    # which compares the repository's own generated files, placeholder and all
    if warning and not check:
        print("stallscope alerts: warning: %s" % warning, file=sys.stderr)
    files = generate.alert_files(cfg)
    extra = [(path, text(cfg)) for path, text in (
        (prometheusrule, generate.prometheus_rule_text), (inhibit_rules, generate.inhibit_rules_text),
        (alertmanagerconfig, generate.alertmanagerconfig_text)) if path]
    try:
        if check:
            diffs = generate.drift(files, out)
            for path, text in extra:
                diffs += generate.drift_file(path, text)
            return _finish("alerts", diffs, [], True)
        written = generate.write(files, out)
        for path, text in extra:
            written.append(generate.write_file(path, text))
    except OSError as e:
        return _fail("alerts", "cannot write %s: %s" % (e.filename, e.strerror))
    return _finish("alerts", [], written, False)


def dashboards(out, config_path=None, check=False):
    cfg, err = _load("dashboards", config_path)
    if err is not None:
        return err
    try:
        files = generate.dashboard_files(cfg)
    except ImportError as e:
        return _fail("dashboards",
                     "needs grafana-foundation-sdk (pip install 'stallscope[dashboards]'): %s" % e)
    try:
        if check:
            return _finish("dashboards", generate.drift(files, out), [], True)
        written = generate.write(files, out)
    except OSError as e:
        return _fail("dashboards", "cannot write %s: %s" % (e.filename, e.strerror))
    return _finish("dashboards", [], written, False)
