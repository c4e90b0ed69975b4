"""The import graph of the package: no cycles, and no part imports upward into what
composes it (issue 13). Read from the source with ast, so a lazy import inside a
function counts as much as one at the top of a module."""
import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    "stallscope")


def modules():
    out = {}
    for dirpath, _dirs, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                if rel.endswith(".__init__"):
                    rel = rel[:-len(".__init__")]
                out[rel] = path
    return out


MODULES = modules()


def imports_of(name, path):
    """stallscope modules that ``name`` imports (a name from a package that is not a
    submodule counts as the package)."""
    tree = ast.parse(open(path).read(), path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for a in node.names:
                sub = base + "." + a.name
                found.add(sub if sub in MODULES else base)
    return {m for m in found if m in MODULES}


GRAPH = {name: imports_of(name, path) for name, path in MODULES.items()}


def cycles():
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read():
    assert "stallscope.agent.main" in GRAPH
    # a relative import resolves to its module: run/session.py's `from ..processes.servers`
    assert "stallscope.processes.servers" in GRAPH["stallscope.run.session"]
    assert "stallscope.exporters.cfs" in GRAPH["stallscope.agent.main"] or \
        "stallscope.exporters" in GRAPH["stallscope.agent.main"]
    assert "stallscope.host.contract" in GRAPH["stallscope.host"]


def test_no_import_cycles():
    assert cycles() == []


# package -> packages it must never import (the ones above it, that compose it)
NEVER = {
    "stallscope.hook": ("stallscope.agent", "stallscope.exporters", "stallscope.correlate",
                        "stallscope.diagnose", "stallscope.mixin", "stallscope.lab",
                        "stallscope.host", "stallscope.vocabulary", "stallscope.system"),
    "stallscope.vocabulary": ("stallscope.agent", "stallscope.exporters", "stallscope.correlate",
                              "stallscope.diagnose", "stallscope.mixin", "stallscope.lab",
                              "stallscope.host", "stallscope.hook", "stallscope.system"),
    "stallscope.system": ("stallscope.agent", "stallscope.exporters", "stallscope.host",
                          "stallscope.correlate", "stallscope.diagnose", "stallscope.lab"),
    "stallscope.host": ("stallscope.agent", "stallscope.exporters", "stallscope.correlate",
                        "stallscope.diagnose", "stallscope.lab"),
    "stallscope.exporters": ("stallscope.agent", "stallscope.correlate", "stallscope.diagnose",
                             "stallscope.lab"),
    "stallscope.correlate": ("stallscope.agent", "stallscope.exporters", "stallscope.host",
                             "stallscope.diagnose", "stallscope.lab", "stallscope.mixin"),
    "stallscope.diagnose": ("stallscope.agent", "stallscope.exporters", "stallscope.lab"),
    "stallscope.mixin": ("stallscope.agent", "stallscope.exporters", "stallscope.diagnose",
                         "stallscope.lab", "stallscope.correlate"),
    # `stallscope run` is a user's command: it shares process groups and teardown with the
    # lab through stallscope.processes, never the lab itself (issue 29).
    "stallscope.run": ("stallscope.lab",),
    # What the lab and `stallscope run` share belongs to neither and knows no part.
    "stallscope.processes": ("stallscope.lab", "stallscope.run", "stallscope.agent",
                             "stallscope.exporters", "stallscope.host", "stallscope.correlate",
                             "stallscope.diagnose", "stallscope.mixin", "stallscope.integrations"),
}


@pytest.mark.parametrize("package", sorted(NEVER))
def test_no_upward_imports(package):
    bad = [(m, t) for m, targets in GRAPH.items() if m == package or m.startswith(package + ".")
           for t in targets for banned in NEVER[package]
           if t == banned or t.startswith(banned + ".")]
    assert bad == []


def test_only_the_composition_root_knows_every_part():
    """Within the agent, only main.py (and the flags beside it) imports the exporters."""
    importers = sorted(m for m, targets in GRAPH.items() if m.startswith("stallscope.agent")
                       and any(t == "stallscope.exporters" or t.startswith("stallscope.exporters.")
                               for t in targets))
    assert importers == ["stallscope.agent.main", "stallscope.agent.options"]
