"""`stallscope report --job --html` (issue 36, item 2): the job report as one
self-contained page with its timeline plot, from the typed JobReport; the CLI's bad
output path is one line and exit 2. (The live report of a real job is rendered in
tests/mixin/test_live.py.)"""
import base64
import io
import re

import pytest
from click.testing import CliRunner

from stallscope.fleet import jobhtml, jobreport

T0 = 1_760_000_000.0
STEP = 15.0


def a_job():
    """Two ranks for 20 minutes; rank 1 waits 60 % of its steps from minute 5 to 15 (the
    storage_errors cause), idle 2 x 0.6 accelerators then."""
    timeline = []
    for i in range(80):
        t = T0 + i * STEP
        stalled = 20 <= i < 60
        timeline.append((t, 0.6 if stalled else 0.02, 1.2 if stalled else 0.0))
    lost = sum(a for _, _, a in timeline) * STEP / 3600
    return jobreport.JobReport(
        namespace="ml", job="resnet", start=T0, end=T0 + 80 * STEP, wall_seconds=80 * STEP, ranks=2,
        accelerator_hours=2 * 80 * STEP / 3600, lost_accelerator_hours=round(lost, 6),
        lost_by_cause={"storage_errors": round(lost * 0.9, 6), "too_few_workers": round(lost * 0.1, 6)},
        ranks_life=(jobreport.RankLife("1", "resnet-1", "node-b", 0.31, 1.0),
                    jobreport.RankLife("0", "resnet-0", "node-a", 0.02, 0.0)),
        worst_periods=(jobreport.Period(T0 + 20 * STEP, T0 + 60 * STEP, round(lost, 6), 0.6,
                                        "storage_errors"),),
        settings=({"num_workers": "4", "prefetch_factor": "2"},),
        changes=(jobreport.SettingsChange("1", T0 + 40 * STEP, {"num_workers": "4"}, {"num_workers": "8"}),),
        cost=3.5, timeline=tuple(timeline))


def test_the_page_carries_the_figures_the_tables_and_its_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    r = a_job()
    png = jobhtml.plot(r, str(tmp_path / "t.png"), warning_line=0.1)
    page = jobhtml.page(r, png)
    assert "<script" not in page and "http://" not in page
    # the headline: the report's own lost and total hours, and its share
    assert "%.3f of %.3f accelerator-hours" % (r.lost_accelerator_hours, r.accelerator_hours) in page
    assert "%.1f%%" % (100 * r.lost_share) in page and "cost 3.50" in page
    # causes by hours lost, most first; the recurring straggler's row marked
    assert page.index("storage_errors") < page.index("too_few_workers")
    assert re.search(r'<tr class="over"><td>1</td><td>resnet-1</td>', page)
    assert "num_workers 4 -&gt; 8" in page
    # the plot: the PNG inlined, drawn with the stall's fill over the middle half of the period
    data = re.search(r'src="data:image/png;base64,([^"]+)"', page).group(1)
    img = Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")
    fill = [x for x in range(img.width) for y in range(0, img.height, 4)
            if all(abs(a - b) <= 12 for a, b in zip(img.getpixel((x, y)), (236, 158, 158)))]
    assert fill, "no data-wait fill in the plot"
    span = (max(fill) - min(fill)) / img.width
    assert 0.3 < span < 0.6, span  # 40 of 80 steps, inside the axes' ~85 % of the width


def test_without_a_plot_the_page_says_why():
    page = jobhtml.page(a_job(), None, "matplotlib is not installed")
    assert "No timeline plot: matplotlib is not installed." in page and "<img" not in page


def test_an_output_path_that_cannot_be_written_is_one_line_and_exit_2(monkeypatch, tmp_path):
    from stallscope import cli

    monkeypatch.setattr(jobreport, "report", lambda *a, **k: a_job())
    out = CliRunner().invoke(cli.main, ["report", "--job", "resnet", "--prometheus", "http://127.0.0.1:9",
                                        "--html", str(tmp_path / "no" / "such" / "dir" / "r.html")])
    assert out.exit_code == 2, out.output
    assert out.output.count("\n") == 1, out.output
    assert out.output.startswith("stallscope report: cannot write"), out.output
