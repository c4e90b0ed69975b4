"""`stallscope top`'s edges: its resolution, its rendering of typed rows, and bad input as
one line and exit 2 (the ranking itself runs against real Prometheus in
tests/mixin/test_live.py)."""
import json
import subprocess
import sys

from stallscope.fleet import lost, top


def test_the_subquery_resolution_keeps_a_period_to_its_points():
    assert top.step_of(300) == 1
    assert top.step_of(86400) == 120  # a day every 2 min
    assert 7 * 86400 / top.step_of(7 * 86400) <= lost.MAX_POINTS


def test_rows_render_as_text_and_json():
    row = top.JobLoss("ml", "llm", 64.0, 16.0, "storage_errors",
                      {"storage_errors": 12.0, "too_few_workers": 4.0}, "3", "llm-3", "node-7", 0.31, 40.0)
    text = top.render_text([row], 86400)
    assert "ml/llm" in text and "16.000" in text and "25.0%" in text and "storage_errors" in text
    assert "rank 3 llm-3 (node-7, 31.0%)" in text and "cost 40.00" in text
    doc = json.loads(top.render_json([row], 86400))
    assert doc["jobs"][0]["lost_share"] == 0.25 and doc["since_seconds"] == 86400
    assert top.render_text([], 3600) == "No job reported in the last 60m.\n"


def test_bad_input_is_one_line_and_exit_2():
    for args, said in ((["--prometheus", "http://127.0.0.1:1", "--since", "5m"], "did not answer"),
                       (["--prometheus", "http://127.0.0.1:1", "--since", "5x"], "bad duration"),
                       (["--prometheus", "http://127.0.0.1:1", "--since", "90d"], "out of range")):
        out = subprocess.run([sys.executable, "-m", "stallscope", "top"] + args,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and out.stdout == "", out
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("stallscope top: ") and said in lines[0], out.stderr


def test_report_bad_input_is_one_line_and_exit_2():
    base = [sys.executable, "-m", "stallscope", "report", "--job", "x", "--prometheus", "http://127.0.0.1:1"]
    for args, said in ((["--since", "1h"], "did not answer"),
                       (["--from", "2030-01-01T00:00:00Z", "--to", "2030-01-02T00:00:00Z"], "in the future"),
                       (["--from", "yesterday"], "bad time"),
                       (["--to", "+1h"], "in the future"),
                       (["--from", "-2h", "--to", "-3h"], "the period is empty"),
                       (["--since", "1h", "--from", "-2h"], "not both")):
        out = subprocess.run(base + args, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and out.stdout == "", out
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("stallscope report: ") and said in lines[0], out.stderr
