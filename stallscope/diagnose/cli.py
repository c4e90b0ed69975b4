"""The diagnose command's body: run, print, exit code; every failure one line."""
import sys

from .errors import DiagnoseError

PREFIX = "stallscope diagnose: "


def main(pod, as_json=False, out=None, err=None, **kwargs):
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        from . import render, report
        doc = report.run(pod, **kwargs)
    except DiagnoseError as e:
        print(PREFIX + str(e), file=err)
        return 2
    except KeyboardInterrupt:
        print(PREFIX + "interrupted", file=err)
        return 2
    except Exception as e:  # a bug must still be one line, not a traceback
        print(PREFIX + "internal error: %s: %s" % (type(e).__name__, e), file=err)
        return 2
    if as_json:
        for w in doc.get("warnings") or []:
            print(PREFIX + "warning: " + w, file=err)
        out.write(render.render_json(doc))
    else:
        out.write(render.render_text(doc))
    out.flush()
    return report.exit_code(doc)
