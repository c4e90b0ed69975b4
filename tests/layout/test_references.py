"""No comment, docstring or doc points at a design file that is not in the repository
(issue 13): every ``*.md`` a file names exists here, by its path from the repository
root or from the naming file, or at least by its name somewhere in the repository."""
import os
import re
import subprocess

from tests.helpers import ROOT

MD = re.compile(r"(?<![\w/.%-])((?:[\w.-]+/)*[\w.-]+\.md)\b")
# Names of files outside this repository that a text may legitimately name (upstream projects).
UPSTREAM = {"CONTRIBUTING.md"}


def tracked():
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [p for p in out.stdout.splitlines() if os.path.exists(os.path.join(ROOT, p))]


def test_every_named_markdown_file_exists():
    files = tracked()
    names = {os.path.basename(p) for p in files}
    missing = []
    for rel in files:
        if not rel.endswith((".py", ".md", ".yaml", ".yml", ".toml", ".json", ".txt")) and \
                os.path.basename(rel) not in ("Makefile", "Dockerfile"):
            continue
        if rel.endswith(".json"):  # data (npm manifests, traces, dashboards), not prose
            continue
        with open(os.path.join(ROOT, rel), errors="replace") as f:
            text = f.read()
        for m in MD.finditer(text):
            ref = m.group(1)
            here = os.path.join(os.path.dirname(os.path.join(ROOT, rel)), ref)
            if ref in UPSTREAM or os.path.exists(os.path.join(ROOT, ref)) or os.path.exists(here):
                continue
            if "/" not in ref and ref in names:
                continue
            missing.append("%s names %s" % (rel, ref))
    assert missing == []
