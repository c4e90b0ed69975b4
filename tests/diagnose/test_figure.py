"""stallscope/figure.py, the one figure-saving helper of the three commands that draw:
a real PNG from matplotlib, one PlotError for a path it cannot write, the figure closed
either way."""
import pytest

from stallscope import figure
from stallscope.diagnose import plot as diagnose_plot
from stallscope.fleet import jobhtml
from stallscope.run import plot as run_plot


def test_a_figure_is_saved_as_a_png_and_closed(tmp_path):
    plt = figure.pyplot()
    path = str(tmp_path / "t.png")
    with figure.drawn(path) as (fig, ax):
        ax.plot([0, 1, 2], [0, 0.5, 0.2])
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    # the IHDR's width and height: SIZE inches at DPI
    assert (int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")) == tuple(
        int(x * figure.DPI) for x in figure.SIZE)
    assert plt.get_fignums() == []


def test_a_path_it_cannot_write_is_one_plot_error_and_the_figure_is_closed(tmp_path):
    plt = figure.pyplot()
    with pytest.raises(figure.PlotError, match="cannot write .*/no/such/dir/t.png: No such file"):
        with figure.drawn(str(tmp_path / "no" / "such" / "dir" / "t.png")) as (fig, ax):
            ax.plot([0, 1], [1, 0])
    assert plt.get_fignums() == []


def test_the_three_commands_raise_the_one_error():
    assert diagnose_plot.PlotError is jobhtml.PlotError is run_plot.PlotError is figure.PlotError
