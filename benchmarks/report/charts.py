"""The report's charts, drawn with matplotlib and returned as inline SVG: the HTML report stays
one file that opens offline. Stores keep one order and one colour everywhere (``store_colors``)."""
from __future__ import annotations

import functools
import io
import itertools
import re
from collections.abc import Callable, Iterable
from typing import Any, ParamSpec, TypeVar

import matplotlib
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from matplotlib.typing import RcKeyType

from trainfeed.benchmarks.records import CellKey, Record
from trainfeed.converters.formats.registry import FORMATS

_P = ParamSpec("_P")
_R = TypeVar("_R")

#: Colours of the known stores; a store without one gets the next colour of ``SPARE``.
COLORS = {"blob": "#d62728", "parquet": "#1f77b4", "delta": "#2ca02c", "hdf5": "#9467bd"}
SPARE = ("#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
COMPUTE, WAIT = "#2ca02c", "#d62728"
#: Text stays text (selectable, searchable, small); ids are stable from run to run.
_RC: dict[RcKeyType, Any] = {"svg.fonttype": "none", "svg.hashsalt": "trainfeed-report", "font.size": 9,
       "font.family": ["DejaVu Sans", "sans-serif"]}


def store_order(names: Iterable[str]) -> list[str]:
    """The blob baseline, then the format registry's order; names the registry does not know
    (results of another trainfeed version) follow in the order given."""
    known = list(dict.fromkeys(["blob", *FORMATS]))
    given = list(dict.fromkeys(names))
    return [s for s in known if s in given] + [s for s in given if s not in known]


def store_colors(stores: list[str]) -> dict[str, str]:
    spare = itertools.cycle(SPARE)
    return {s: COLORS.get(s) or next(spare) for s in stores}


def _drawn(chart: Callable[_P, _R]) -> Callable[_P, _R]:
    """Draw (and save) under the report's matplotlib settings, whatever the caller's are."""
    @functools.wraps(chart)
    def draw(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with matplotlib.rc_context(_RC):
            return chart(*args, **kwargs)
    return draw


def _svg(fig: Figure, label: str) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]  # no XML prolog or DOCTYPE inside HTML
    return re.sub(r"^<svg ", f'<svg class="chart" role="img" aria-label="{label}" ', svg, count=1)


def _figure(width: float, height: float) -> Figure:
    return Figure(figsize=(width, height), layout="constrained")


@_drawn
def throughput(cells: dict[CellKey, Record], stores: list[str], nodes: list[str], fw: str) -> str:
    """Grouped bars: samples/s of the real run per node (groups) and store (bars), log scale."""
    colors = store_colors(stores)
    fig = _figure(9, 3.8)
    ax = fig.add_subplot()
    width = 0.8 / len(stores)
    for i, s in enumerate(stores):
        xs = [j for j, n in enumerate(nodes) if (s, n, fw) in cells]
        ys = [cells[(s, nodes[j], fw)]["real"]["samples_per_s"] or 0 for j in xs]
        bars = ax.bar([j - 0.4 + width * (i + 0.5) for j in xs], ys, width * 0.9, label=s, color=colors[s])
        ax.bar_label(bars, labels=[f"{y:,.0f}" for y in ys], fontsize=7, padding=2)
    ax.set_yscale("log")
    ax.set_xticks(range(len(nodes)), nodes)
    ax.set_xlabel("node")
    ax.set_ylabel("samples/s (log scale)")
    ax.set_title(f"Training throughput per node and store ({fw}): the real run")
    ax.margins(y=0.15)
    fig.legend(loc="outside upper center", ncols=len(stores), frameon=False)
    return _svg(fig, f"throughput {fw}")


@_drawn
def stall(cells: dict[CellKey, Record], stores: list[str], nodes: list[str], fw: str) -> str:
    """One horizontal bar per cell: the share of the run spent computing, then waiting for data."""
    items = [(s, n) for n in nodes for s in stores if (s, n, fw) in cells]
    fig = _figure(9, 0.9 + 0.28 * len(items))
    ax = fig.add_subplot()
    waits = [100 * (cells[(s, n, fw)]["real"]["stall_fraction"] or 0) for s, n in items]
    rows = range(len(items))
    ax.barh(rows, [100 - w for w in waits], color=COMPUTE, label="compute")
    bars = ax.barh(rows, waits, left=[100 - w for w in waits], color=WAIT, label="waiting for data")
    ax.bar_label(bars, labels=[f"{w:.0f}% wait" for w in waits], padding=3, fontsize=7)
    ax.set_yticks(rows, [f"{s} / {n}" for s, n in items])
    ax.invert_yaxis()
    ax.set_xlim(0, 115)
    ax.set_xticks(range(0, 101, 20))
    ax.set_xlabel("% of the run's wall time")
    ax.set_title(f"Where the time goes ({fw})")
    fig.legend(loc="outside upper center", ncols=2, frameon=False)
    return _svg(fig, f"stall breakdown {fw}")


@_drawn
def utilization(cells: dict[CellKey, Record], stores: list[str], nodes: list[str], fw: str) -> str:
    """Small multiples: one panel per cell (rows: stores, columns: nodes), CPU % of the machine
    and of the benchmark process (and GPU % where sampled) over the run's seconds."""
    if not any(c["real"].get("utilization_timeline") for (_, _, f), c in cells.items() if f == fw):
        return ""
    fig = _figure(3 * len(nodes) + 1, 1.9 * len(stores) + 0.8)
    axes = fig.subplots(len(stores), len(nodes), squeeze=False, sharey=True)
    for r, s in enumerate(stores):
        for k, n in enumerate(nodes):
            ax = axes[r][k]
            ax.set_title(f"{s} · {n}", fontsize=9)
            ax.set_gid(re.sub(r"[^\w.-]", "_", f"utilization-{s}-{n}-{fw}"))  # an XML id: node@cluster -> node_cluster
            cell = cells.get((s, n, fw))
            points = cell["real"].get("utilization_timeline") if cell else None
            if cell and points:
                _plot_timeline(ax, points, cell["env"]["cores"])
            else:
                ax.text(0.5, 0.5, "no samples" if cell else "not measured", ha="center", va="center",
                        transform=ax.transAxes, color="#777")
            ax.set_ylim(0, 105)
            ax.grid(alpha=0.3)
            if r == len(stores) - 1:
                ax.set_xlabel("time (s)")
            if k == 0:
                ax.set_ylabel("%")
    legend: dict[str, Artist] = {}  # one legend for all panels: the same lines in each
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    fig.legend(list(legend.values()), list(legend), loc="outside lower center", ncols=len(legend), frameon=False)
    fig.suptitle(f"Utilization over each run ({fw}), sampled about once a second")
    return _svg(fig, f"utilization {fw}")


def _plot_timeline(ax: Axes, points: list[Record], cores: int) -> None:
    t = [p["t"] for p in points]
    line: dict[str, Any] = {"lw": 1.2, "marker": "o", "ms": 2.5}  # markers: a short run has a single sample
    ax.plot(t, [p["cpu_percent"] for p in points], color="#1f77b4", label="machine CPU %", **line)
    ax.plot(t, [p.get("process_cpu_percent", 0) / max(1, cores) for p in points], color="#ff7f0e", ls="--",
            label="benchmark process, % of all cores", **line)
    gpus = sorted({k for p in points for k in p if k.endswith("_util_percent")})
    for g in gpus:
        ax.plot(t, [p.get(g, 0) for p in points], label=f"{g.split('_')[0]} utilization %", **line)
    ax.set_xlim(0, 1.03 * max(max(t), 1.0))  # the last sample inside the panel
    ax.xaxis.set_major_locator(MaxNLocator(5))
