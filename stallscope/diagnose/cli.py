"""The diagnose command's body: run, print, exit code; every failure one line."""
from __future__ import annotations

import sys
from typing import IO, Any

from .errors import DiagnoseError

PREFIX = "stallscope diagnose: "


def main(pod: str, as_json: bool = False, out: IO[str] | None = None, err: IO[str] | None = None,
         **kwargs: Any) -> int:
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
        for w in doc.warnings:
            print(PREFIX + "warning: " + w, file=err)
        out.write(render.render_json(doc))
    else:
        out.write(render.render_text(doc))
    out.flush()
    return report.exit_code(doc)
