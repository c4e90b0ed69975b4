"""The one way the commands that draw make a PNG (``stallscope diagnose --plot``,
``stallscope run``'s report, ``stallscope report``'s job page): matplotlib imported only
when a figure is drawn, on the Agg backend (no display), the figure closed whatever
happens, and one error for a plot that cannot be drawn or written."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

DPI = 100
SIZE = (11, 4)  # inches: a timeline across a report page


class PlotError(Exception):
    """Why a plot was not drawn, in one line for the user (the report goes on without it)."""


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend; PlotError when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError("matplotlib is not installed: pip install 'stallscope[plot]'") from None
    return plt


@contextlib.contextmanager
def drawn(path: str, size: tuple[float, float] = SIZE) -> Iterator[tuple[Any, Any]]:
    """``with drawn(path) as (fig, ax):`` draw on ``ax``; at the end of the block the
    figure is laid out and saved as a PNG at ``path`` (PlotError when it cannot be
    written) and closed."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=size)
    try:
        yield fig, ax
        fig.tight_layout()
        try:
            fig.savefig(path, dpi=DPI)
        except OSError as e:
            raise PlotError("cannot write %s: %s" % (path, e.strerror or e)) from e
    finally:
        plt.close(fig)
