"""Thin helpers over grafana-foundation-sdk (pinned 1769699379!11.6.0) so the dashboards
read as a list of panels: a title, a description that says how to read it, queries.

Every panel queries ``${datasource}``; every query filters on the template variables
its series carry (see VARS_*), and raw counters use ``$__rate_interval``.
"""
from grafana_foundation_sdk.builders import (
    bargauge,
    common,
    dashboard,
    heatmap,
    prometheus,
    stat,
    statushistory,
    table,
    timeseries,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models.heatmap import HeatmapColorMode
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from ..banner import BANNER

DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"

VARS_NODE = ('node=~"$node"',)
VARS_POD = ('namespace=~"$namespace"', 'job=~"$job"', 'node=~"$node"', 'pod=~"$pod"')
VARS_RANK = VARS_POD + ('rank=~"$rank"',)
# The variables chain: each one lists the values left by the ones before it.
VARIABLE_CHAIN = ("namespace", "job", "node", "pod", "rank")


def q(expr, legend="", instant=False, fmt=None):
    t = prometheus.Dataquery().expr(expr).legend_format(legend or "__auto")
    if instant:
        t = t.instant()
    if fmt is not None:
        t = t.format(fmt)
    return t


def _with(builder, title, description, targets, unit, w, h):
    builder = builder.title(title).description(description).datasource(DS).span(w).height(h)
    if unit:
        builder = builder.unit(unit)
    for i, t in enumerate(targets):
        builder = builder.with_target(t.ref_id(chr(ord("A") + i)))
    return builder


def _steps(*steps):
    return (dashboard.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE)
            .steps([dm.Threshold(value=v, color=c) for v, c in steps]))


def thresholds(warning=None, critical=None):
    steps = [(None, "green")]
    if warning is not None:
        steps.append((float(warning), "orange"))
    if critical is not None:
        steps.append((float(critical), "red"))
    return _steps(*steps)


def ts(title, description, targets, unit="short", w=12, h=8, min_val=None, max_val=None,
       warn=None, crit=None):
    p = _with(timeseries.Panel(), title, description, targets, unit, w, h)
    p = p.line_width(1).fill_opacity(8).legend(
        common.VizLegendOptions().display_mode(cm.LegendDisplayMode.TABLE)
        .placement(cm.LegendPlacement.BOTTOM).show_legend(True).calcs(["lastNotNull", "max"]))
    if min_val is not None:
        p = p.min(min_val)
    if max_val is not None:
        p = p.max(max_val)
    if warn is not None or crit is not None:
        p = p.thresholds(thresholds(warn, crit)).thresholds_style(
            common.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.DASHED))
    return p


def single(title, description, target, unit="short", w=6, h=4, warn=None, crit=None):
    p = _with(stat.Panel(), title, description, [target], unit, w, h)
    p = p.graph_mode(cm.BigValueGraphMode.AREA).color_mode(cm.BigValueColorMode.VALUE)
    p = p.reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]))
    return p.thresholds(thresholds(warn, crit))


def tabular(title, description, targets, unit="short", w=12, h=8, hide=("Time",)):
    p = _with(table.Panel(), title, description, targets, unit, w, h)
    p = p.align(cm.FieldTextAlignment.AUTO).inspect(False)  # the defaults, spelled out
    return p.with_transformation(dm.DataTransformerConfig(
        id_val="organize", options={"excludeByName": {k: True for k in hide}, "renameByName": {
            "Value": "value"}}))


def history(title, description, target, unit="percentunit", w=24, h=8, warn=None, crit=None):
    p = _with(statushistory.Panel(), title, description, [target], unit, w, h)
    p = p.show_value(cm.VisibilityMode.NEVER).row_height(0.9).line_width(1).fill_opacity(70)
    return p.thresholds(thresholds(warn, crit)).color_scheme(
        dashboard.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS))


def heat(title, description, target, unit="s", w=12, h=8):
    p = _with(heatmap.Panel(), title, description, [target], None, w, h)
    return (p.calculate(False).y_axis(heatmap.YAxisConfig().unit(unit))
            .color(heatmap.HeatmapColorOptions().mode(HeatmapColorMode.SCHEME).scheme("Oranges").steps(64)))


def bars(title, description, targets, unit="percentunit", w=12, h=8, min_val=0, max_val=1):
    p = _with(bargauge.Panel(), title, description, targets, unit, w, h)
    return p.min(min_val).max(max_val).display_mode(cm.BarGaugeDisplayMode.GRADIENT)


def field_link(panel, field, title, url, new_tab=False):
    """A data link on one column of a table: each cell links ``url``, in which Grafana
    fills ``${__data.fields.<name>}`` from the cell's row and ``${__value.raw}`` from the
    cell itself."""
    return panel.override_by_name(field, [dm.DynamicConfigValue(id_val="links", value=[
        {"title": title, "url": url, "targetBlank": new_tab}])])


def drill_down_url(cfg, uid, fields=VARIABLE_CHAIN):
    """The URL of dashboard ``uid`` with its variables set from a table row's ``fields``
    (the row's labels), the current time range and data source."""
    return "/d/%s%s?%s&${__url_time_range}&${datasource:queryparam}" % (
        cfg.dashboard_uid_prefix, uid, "&".join("var-%s=${__data.fields.%s}" % (f, f) for f in fields))


# Grafana's custom-unit syntax: a number with this suffix (no built-in unit says batches)
BATCHES_PER_SECOND = "suffix: batch/s"
EVENTS_PER_SECOND = "suffix: events/s"
CORES = "suffix: cores"

HEATMAP = PromQueryFormat.HEATMAP
TABLE = PromQueryFormat.TABLE


def variables(cfg, series):
    """datasource, then namespace → job → node → pod → rank, each filtered by those before."""
    out = [dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")]
    for i, name in enumerate(VARIABLE_CHAIN):
        before = ['%s=~"$%s"' % (v, v) for v in VARIABLE_CHAIN[:i]]
        body = cfg.sel(*before)
        metric = "%s{%s}" % (series, body) if body else series
        out.append(
            dashboard.QueryVariable(name).label(name).datasource(DS)
            .query("label_values(%s, %s)" % (metric, name))
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dm.VariableSort.NATURAL_ASC if name == "rank" else dm.VariableSort.ALPHABETICAL_ASC)
            .multi(True).include_all(True).all_value(".*")
            .current(dm.VariableOption(selected=True, text="All", value="$__all")))
    return out


class Board:
    """A dashboard built in reading order: rows and the panels under them."""

    def __init__(self, cfg, uid, title, description, series="stallscope_step_seconds_count"):
        self.cfg = cfg
        self.d = (dashboard.Dashboard(title).uid(cfg.dashboard_uid_prefix + uid)
                  .description(description + " " + BANNER % "dashboards")
                  .tags(list(cfg.dashboard_tags)).refresh(cfg.dashboard_refresh)
                  .time(cfg.dashboard_time_from, "now").timezone("browser").editable()
                  .tooltip(dm.DashboardCursorSync.CROSSHAIR))
        for v in variables(cfg, series):
            self.d = self.d.with_variable(v)

    def link(self, title, uid):
        self.d = self.d.link(dashboard.DashboardLink(title).type(dm.DashboardLinkType.LINK)
                             .url("/d/%s%s" % (self.cfg.dashboard_uid_prefix, uid))
                             .include_vars(True).keep_time(True).icon("dashboard"))
        return self

    def row(self, title):
        self.d = self.d.with_row(dashboard.Row(title))
        return self

    def add(self, *panels):
        for p in panels:
            self.d = self.d.with_panel(p)
        return self

    def model(self):
        """The dashboard as plain JSON data, panel ids numbered in reading order."""
        import json

        model = json.loads(json.dumps(self.d.build(), cls=JSONEncoder))
        for i, panel in enumerate(model["panels"], 1):
            panel["id"] = i
        return model
