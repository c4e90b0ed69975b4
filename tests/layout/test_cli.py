"""The command line: every command is reachable however it is started."""
import subprocess
import sys

from stallscope import cli


def _commands(*args):
    out = subprocess.run([sys.executable, *args, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    listed = out.stdout.split("Commands:", 1)[1]
    return {line.split()[0] for line in listed.splitlines() if line.strip()}


def test_python_dash_m_lists_every_command_the_entry_point_has():
    # `python -m stallscope.cli` ran main() before `run` and `compare` were defined
    registered = set(cli.main.commands)
    assert {"agent", "diagnose", "run", "compare", "lab"} <= registered
    assert _commands("-m", "stallscope.cli") == registered
    assert _commands("-m", "stallscope") == registered
