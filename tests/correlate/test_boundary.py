"""Issue 50, item 5: the analysis reasons from the data in the trace, not the transport's
timing: no module of correlate/ imports the hook's modules but the wire's types
(hook/wire.py), nor the report cadences (cadence.py)."""
import ast
import pathlib

import stallscope.correlate

ROOT = pathlib.Path(stallscope.correlate.__file__).parent
FORBIDDEN = ("stallscope.hook", "stallscope.cadence")
ALLOWED = ("stallscope.hook.wire",)


def imported(path):
    """The absolute names of the modules a file imports (relative ones resolved)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "stallscope.correlate".split(".")
            if node.level:
                base = base[:len(base) - node.level + 1]
                yield ".".join(base + ([node.module] if node.module else []))
            else:
                yield node.module or ""
            for a in node.names:  # "from .. import cadence"
                if node.level:
                    yield ".".join(base + ([node.module] if node.module else []) + [a.name])


def test_the_analysis_imports_neither_the_hook_nor_the_report_cadences():
    files = sorted(ROOT.glob("*.py"))
    assert len(files) > 20
    found = {(p.name, name) for p in files for name in imported(p)
             if name.startswith(FORBIDDEN) and not name.startswith(ALLOWED)}
    assert not found, found
