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
    """The absolute names a file imports: modules, and for ``from X import y`` each
    X.y (relative ones resolved): what comes from where."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ["stallscope", "correlate"]
            parts = base[:len(base) - node.level + 1] if node.level else []
            module = parts + (node.module.split(".") if node.module else [])
            for a in node.names:
                yield ".".join(module + [a.name])


def test_the_analysis_imports_neither_the_hook_nor_the_report_cadences(tmp_path):
    files = sorted(ROOT.glob("*.py"))
    assert len(files) > 20
    found = {(p.name, name) for p in files for name in imported(p)
             if name.startswith(FORBIDDEN) and not name.startswith(ALLOWED)}
    assert not found, found
    # what it finds: each of these would be caught, the wire's types would not (a file
    # read as if it were one of correlate/)
    probe = tmp_path / "probe.py"
    probe.write_text("from ..hook import channel\nfrom .. import cadence\n"
                     "from ..cadence import WORKER_FLUSH_S\nfrom ..hook.wire import Columns\n"
                     "import stallscope.hook.stream\n")
    caught = sorted(n for n in imported(probe) if n.startswith(FORBIDDEN) and not n.startswith(ALLOWED))
    assert caught == ["stallscope.cadence", "stallscope.cadence.WORKER_FLUSH_S",
                      "stallscope.hook.channel", "stallscope.hook.stream"]
