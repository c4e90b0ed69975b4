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


# The agent in rooms (issue 51): its sub-packages, each with a package map; a room never
# imports the level above it (the composition: main, options, host, api, malloc) and the
# rooms import each other in one direction only.
AGENT = "stallscope.agent"
ROOMS = ("identity", "parts", "table", "web")
# room -> rooms it may import
ROOM_MAY_IMPORT = {"web": (), "identity": (), "table": ("identity",), "parts": ("table", "web")}


def room_of(module):
    """The agent room a module is in, "" for the agent's top level, None outside it."""
    if module != AGENT and not module.startswith(AGENT + "."):
        return None
    rest = module[len(AGENT) + 1:].split(".") if module != AGENT else []
    return rest[0] if len(rest) > 1 or (rest and rest[0] in ROOMS) else ""


def test_the_agent_is_in_rooms():
    found = sorted(name for name, path in MODULES.items() if path.endswith("__init__.py")
                   and name.startswith(AGENT + ".") and name.count(".") == 2)
    assert found == [AGENT + "." + r for r in ROOMS]
    top = sorted(name for name in MODULES if room_of(name) == "" and name != AGENT)
    assert top == [AGENT + "." + m for m in ("api", "host", "main", "malloc", "options")]


def test_no_room_imports_upward_or_sideways_against_the_grain():
    bad = []
    for m, targets in GRAPH.items():
        room = room_of(m)
        if not room:
            continue
        for t in targets:
            other = room_of(t)
            if other is None or other == room:
                continue
            if other == "" or other not in ROOM_MAY_IMPORT[room]:
                bad.append((m, t))
    assert bad == []


def package_cycles(prefix, depth):
    """Cycles in the graph of the packages ``depth`` levels under ``prefix`` (each
    package stands for all its modules)."""
    def pkg(m):
        parts = m.split(".")
        base = len(prefix.split("."))
        return ".".join(parts[:base + depth]) if len(parts) > base + depth - 1 else None

    graph = {}
    for m, targets in GRAPH.items():
        a = pkg(m) if m.startswith(prefix + ".") else None
        if a is None:
            continue
        graph.setdefault(a, set()).update(
            b for b in (pkg(t) for t in targets if t.startswith(prefix + ".")) if b and b != a)
    seen, on, out = set(), [], []

    def visit(v):
        on.append(v)
        for w in sorted(graph.get(v, ())):
            if w in on:
                out.append(on[on.index(w):] + [w])
            elif w not in seen:
                visit(w)
        on.pop()
        seen.add(v)

    for v in sorted(graph):
        if v not in seen:
            visit(v)
    return out


@pytest.mark.parametrize("prefix", ["stallscope", AGENT])
def test_no_cycles_between_packages(prefix):
    """Not only modules: the agent's rooms (and the top-level packages, each taken
    whole) form no circle either."""
    assert package_cycles(prefix, 1) == []


def test_package_cycles_are_found():
    """The cycle finder finds a circle when there is one (the test above cannot pass
    vacuously)."""
    GRAPH["stallscope.agent.web.__probe__"] = {"stallscope.agent.parts.loader"}
    try:
        assert package_cycles(AGENT, 1) != []
    finally:
        del GRAPH["stallscope.agent.web.__probe__"]


MAPPED = [AGENT] + [AGENT + "." + r for r in ROOMS] + ["stallscope.lab", "stallscope.mixin"]


@pytest.mark.parametrize("package", MAPPED)
def test_package_map_names_every_module(package):
    """Each of these packages says in its __init__ docstring what lives there: every
    module and sub-package by its file name, and what may import what."""
    doc = ast.get_docstring(ast.parse(open(MODULES[package]).read())) or ""
    here = os.path.dirname(MODULES[package])
    names = sorted(f for f in os.listdir(here) if f.endswith(".py") and f != "__init__.py") + \
        sorted(d + "/" for d in os.listdir(here) if os.path.exists(os.path.join(here, d, "__init__.py")))
    missing = [n for n in names if n not in doc]
    assert missing == []
    assert "import" in doc.lower()  # what may import what


LAB_RANK = ("trainer", "dataset", "sources", "growth", "survive", "handover")


def test_a_lab_rank_loads_only_the_hook_and_itself():
    """What runs inside a lab rank's training process and loader workers imports the hook
    (``import stallscope``) and these modules only, as the lab's map says."""
    allowed = {"stallscope"} | {"stallscope.lab." + m for m in LAB_RANK}
    bad = [(m, t) for m in allowed - {"stallscope"} for t in GRAPH[m] if t not in allowed]
    assert bad == []
