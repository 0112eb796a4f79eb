"""results.jsonl -> results.csv, report.md and report.html (charts as inline SVG: no plotting
library, no network, renders anywhere). The A/B table comes first, as in the whitepaper."""
from __future__ import annotations

import csv
import html
from datetime import datetime, timezone
from pathlib import Path

from trainfeed.converters.redact import redact

from .cost import CATALOG, load_catalog, project, recommend
from .matrix import load_results

STORE_ORDER = ("blob", "parquet", "delta", "hdf5")
COLORS = {"blob": "#d62728", "parquet": "#1f77b4", "delta": "#2ca02c", "hdf5": "#9467bd"}


def _cells(records):
    cells = {}
    for r in records:  # the last repeat of a cell wins the table; all stay in results.jsonl
        if r["kind"] == "cell":
            cells[(r["store"], r["node"], r["framework"])] = r
    return cells


def _node_label(cell) -> str:
    if cell.get("node_kind") == "emulated":
        return f"{cell['node']} (emulated, {cell['compute_only']['how']})"
    return f"{cell['node']} (this machine)"


def _hours(samples: int, epochs: int, rate: float | None) -> str:
    if not rate:
        return "-"
    h = samples * epochs / rate / 3600
    return f"{h * 60:.0f} min" if h < 1 else f"{h:.1f} h"


def _failed(records, cells):
    """Failed cells, the last failure of each, unless a repeat of the cell was measured."""
    failed = {}
    for r in records:
        key = (r["store"], r.get("node"), r.get("framework"))
        if r["kind"] == "error" and key not in cells:
            failed[key] = r
    return failed


def _failure_line(rec: dict) -> str:
    return redact(f"{rec['store']} x {rec.get('node') or '-'} {rec.get('framework') or '-'} "
                  f"({rec.get('stage', '?')}): {rec['error']}")


def build(out: str, *, target_samples: int = 650_000, target_epochs: int = 5, catalog: Path = CATALOG) -> dict:
    records = load_results(out)
    cells = _cells(records)
    errors = [r for r in records if r["kind"] == "error"]
    failed = _failed(records, cells)
    stores = [s for s in STORE_ORDER if any(k[0] == s for k in cells)]
    nodes = list(dict.fromkeys(k[1] for k in cells))
    frameworks = list(dict.fromkeys(k[2] for k in cells))
    instances, notes = load_catalog(catalog)
    projections = {s: project(list(cells.values()), instances, s, target_samples=target_samples, epochs=target_epochs)
                   for s in stores}
    rec = recommend(projections)
    outdir = Path(out)
    _write_csv(outdir / "results.csv", cells.values(), failed.values())
    if cells:
        md = _markdown(cells, stores, nodes, frameworks, projections, rec, notes, errors, target_samples, target_epochs)
    else:
        md = _markdown_nothing_measured(records, errors)
    (outdir / "report.md").write_text(md)
    (outdir / "report.html").write_text(_html(md, cells, stores, nodes, frameworks))
    return {"report_md": str(outdir / "report.md"), "report_html": str(outdir / "report.html"),
            "results_csv": str(outdir / "results.csv"), "cells": len(cells), "errors": len(errors),
            "failed_cells": len(failed), "first_error": _failure_line(errors[0]) if errors else None,
            "recommendation": rec}


CSV_COLUMNS = ["store", "node", "framework", "node_kind", "compute_only_samples_per_s", "compute_how",
               "ingest_only_samples_per_s", "samples_per_s", "mb_per_s", "stall_fraction", "au",
               "cpu_percent_mean", "rss_mb_max", "bottleneck", "advice", "failed_stage", "error"]


def _write_csv(path: Path, cells, failed) -> None:
    """One row per measured cell, then one per failed cell (its stage and error, no measures)."""
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_COLUMNS)
        for c in cells:
            u = c["real"].get("utilization", {})
            w.writerow([c["store"], c["node"], c["framework"], c.get("node_kind"), c["compute_only"]["samples_per_s"],
                        c["compute_only"]["how"], c["ingest_only"]["samples_per_s"], c["real"]["samples_per_s"],
                        c["real"]["mb_per_s"], c["real"]["stall_fraction"], c["real"]["au"],
                        u.get("cpu_percent_mean"), u.get("rss_mb_max"), c["verdict"]["bottleneck"],
                        c["verdict"]["advice"], "", ""])
        for e in failed:
            row = dict.fromkeys(CSV_COLUMNS, "")
            row.update(store=e["store"], node=e.get("node") or "", framework=e.get("framework") or "",
                       failed_stage=e.get("stage", ""), error=redact(e["error"]))
            w.writerow(row.values())


def _markdown(cells, stores, nodes, frameworks, projections, rec, notes, errors, target, epochs) -> str:
    any_cell = next(iter(cells.values()))
    env = any_cell["env"]
    lines = ["# Storage A/B report", "",
             f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC · machine: {env['cores']} vCPUs, {env['ram_gb']} GB RAM, "
             f"GPU: {env['gpu'] or 'none'} · samples {'x'.join(map(str, any_cell['sample_shape']))} "
             f"({any_cell['sample_bytes'] / 1e3:.0f} KB) · batch {any_cell['batch_size']} · model ResNet-18 width "
             f"{any_cell['width']} · blob profile: {any_cell.get('blob_profile') or next((c.get('blob_profile') for c in cells.values() if c.get('blob_profile')), 'none')}",
             "", f"## Training time for {target:,} samples x {epochs} epochs", "",
             "Projected from the rate measured in each cell (real run: the reader feeding the step). "
             "Emulated nodes compute for the profile's step time (\"estimate\": from FLOPs and the datasheet peak).", ""]
    for fw in frameworks:
        lines += [f"**{fw}**", "", "| node | " + " | ".join(stores) + " | compacted vs blob |",
                  "|---|" + "---|" * (len(stores) + 1)]
        for node in nodes:
            row, rates = [], {}
            label = None
            for s in stores:
                c = cells.get((s, node, fw))
                if c is None:
                    row.append("-")
                    continue
                label = label or _node_label(c)
                rates[s] = c["real"]["samples_per_s"]
                row.append(f"{_hours(target, epochs, rates[s])} ({rates[s]:,.0f}/s)")
            best = max((rates[s] for s in rates if s != "blob"), default=None)
            ratio = f"{best / rates['blob']:.1f}x faster" if best and rates.get("blob") else "-"
            lines.append(f"| {label or node} | " + " | ".join(row) + f" | {ratio} |")
        lines.append("")
    lines += ["## Why: each cell", "",
              "| store | node | fw | compute-only /s | ingest-only /s | real /s | MB/s | stall | AU | CPU % | bottleneck | advice |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (s, n, fw), c in sorted(cells.items(), key=lambda kv: (nodes.index(kv[0][1]), stores.index(kv[0][0]))):
        r, u = c["real"], c["real"].get("utilization", {})
        lines.append(f"| {s} | {n} | {fw} | {c['compute_only']['samples_per_s']:,.0f} ({c['compute_only']['how']}) | "
                     f"{c['ingest_only']['samples_per_s']:,.0f} | {r['samples_per_s']:,.0f} | {r['mb_per_s']:,.1f} | "
                     f"{100 * r['stall_fraction']:.0f}% | {100 * r['au']:.0f}% | {u.get('cpu_percent_mean', '-')} | "
                     f"{c['verdict']['bottleneck']} | {c['verdict']['advice']} |")
    lines += ["", "## What it costs", ""]
    for s, rows in projections.items():
        if not rows:
            continue
        lines += [f"**{s}** — normalized as in the reference post: fastest = 1.0, cheapest = 1.0", "",
                  "| instance | vCPUs | GPUs | rate /s | time | on-demand $ | spot $ | time vs fastest | cost vs cheapest | constraint |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            od = f"{r['on_demand_usd']:,.2f}" if r["on_demand_usd"] else "no price"
            sp = f"{r['spot_usd']:,.2f}" if r["spot_usd"] else "-"
            tv = f"{r['time_vs_fastest']:.1f}"
            cv = f"{r['cost_vs_cheapest']:.1f}" if r["cost_vs_cheapest"] else "-"
            note = f"; {r['ram_note']}" if r.get("ram_note") else ""
            lines.append(f"| {r['cloud']} {r['instance']} | {r['vcpus']} | {r['gpus']} {r['gpu_model']} | "
                         f"{r['samples_per_s']:,.0f} | {r['hours']:.1f} h | {od} | {sp} | {tv} | {cv} | {r['constraint']}{note} |")
        lines.append("")
    if rec:
        ch, fa = rec["cheapest"], rec["fastest"]
        lines += ["## Recommendation", "",
                  f"- **Cheapest**: {ch['store']} on {ch['cloud']} {ch['instance']}: {ch['hours']:.1f} h, "
                  f"${ch['on_demand_usd']:,.2f} on demand. Limit: {ch['constraint']}.",
                  f"- **Fastest**: {fa['store']} on {fa['cloud']} {fa['instance']}: {fa['hours']:.1f} h. "
                  f"Limit: {fa['constraint']}.", ""]
    lines += ["## How the projections were made", "",
              "- Measured cells: the real reader and, on this machine's CPU, the real model; on emulated nodes the "
              "step sleeps for the accelerator profile's step time, so data wait is measured, compute is modelled.",
              "- GPU instances: min(GPU compute rate from the profile x GPUs, this store's ingest-only rate x instance "
              "vCPUs / local vCPUs), i.e. reader workers (blob: concurrent GETs) scaled with vCPUs as measured here "
              "per vCPU. CPU instances: the CPU-node rate x vCPUs / local vCPUs. Linear vCPU scaling is an "
              "assumption; `storage-bench calibrate` on the real instance replaces estimates with measurements.",
              "- Prices: the catalog (benchmarks/instances.csv) with each price's date and source; rows without a "
              "price get a time but no cost.", ""]
    if notes:
        lines += ["Catalog notes:", ""] + [f"- {n}" for n in notes] + [""]
    lines += _failures_section(errors)
    return "\n".join(lines) + "\n"


def _failures_section(errors) -> list[str]:
    if not errors:
        return []
    lines = ["## Cells that failed", "", "| store | node | fw | repeat | stage | error |", "|---|---|---|---|---|---|"]
    for e in errors:
        message = redact(e["error"]).replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {e['store']} | {e.get('node') or '-'} | {e.get('framework') or '-'} | "
                     f"{e.get('repeat', '-')} | {e.get('stage', '-')} | {message} |")
    return lines + [""]


def _markdown_nothing_measured(records, errors) -> str:
    env = next((r["env"] for r in records if r.get("env")), None)
    machine = f" · machine: {env['cores']} vCPUs, {env['ram_gb']} GB RAM, GPU: {env['gpu'] or 'none'}" if env else ""
    lines = ["# Storage A/B report", "",
             f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC{machine}", "",
             f"**No cell was measured**: all {len(errors)} failed, so there is nothing to compare or project. "
             "Each failure and its reason:", ""]
    return "\n".join(lines + _failures_section(errors))


# ------------------------------------------------------------------ HTML and SVG

def _bars(title: str, groups: list[str], series: list[str], values: dict, log: bool = True, unit: str = "samples/s") -> str:
    import math

    w, h, pad = 720, 300, 50
    vals = [v for v in values.values() if v]
    if not vals:
        return ""
    top = max(vals)
    lo = min(vals)
    f = (lambda v: (math.log10(v) - math.log10(lo) + 0.3) / (math.log10(top) - math.log10(lo) + 0.3)) if log and top > lo \
        else (lambda v: v / top)
    gw = (w - 2 * pad) / max(1, len(groups))
    bw = gw * 0.8 / max(1, len(series))
    parts = [f'<svg class="chart" viewBox="0 0 {w} {h + 40}" width="{w}" height="{h + 40}" role="img" aria-label="{html.escape(title)}">',
             f'<text x="{w / 2}" y="16" text-anchor="middle" font-weight="bold">{html.escape(title)}</text>']
    for gi, g in enumerate(groups):
        x0 = pad + gi * gw + gw * 0.1
        parts.append(f'<text x="{pad + gi * gw + gw / 2}" y="{h + 15}" text-anchor="middle" font-size="12">{html.escape(g)}</text>')
        for si, s in enumerate(series):
            v = values.get((g, s))
            if not v:
                continue
            bh = max(2, f(v) * (h - 40))
            x = x0 + si * bw
            parts.append(f'<rect x="{x:.1f}" y="{h - bh:.1f}" width="{bw * 0.9:.1f}" height="{bh:.1f}" '
                         f'fill="{COLORS.get(s, "#888")}"><title>{html.escape(s)} on {html.escape(g)}: {v:,.1f} {unit}</title></rect>')
            parts.append(f'<text x="{x + bw * 0.45:.1f}" y="{h - bh - 3:.1f}" text-anchor="middle" font-size="10">{v:,.0f}</text>')
    for si, s in enumerate(series):
        parts.append(f'<rect x="{pad + si * 110}" y="{h + 25}" width="12" height="12" fill="{COLORS.get(s, "#888")}"/>'
                     f'<text x="{pad + si * 110 + 16}" y="{h + 35}" font-size="12">{html.escape(s)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _stall(cells, stores, nodes, fw) -> str:
    w, row = 720, 22
    items = [(s, n, cells[(s, n, fw)]) for n in nodes for s in stores if (s, n, fw) in cells]
    h = 40 + row * len(items)
    parts = [f'<svg class="chart" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="stall breakdown">',
             f'<text x="{w / 2}" y="16" text-anchor="middle" font-weight="bold">Where the time goes ({fw}): '
             f'compute (green) vs waiting for data (red)</text>']
    for i, (s, n, c) in enumerate(items):
        y = 30 + i * row
        stall = c["real"]["stall_fraction"] or 0
        bw = w - 230
        parts.append(f'<text x="5" y="{y + 14}" font-size="12">{html.escape(s)} / {html.escape(n)}</text>')
        parts.append(f'<rect x="170" y="{y}" width="{bw * (1 - stall):.1f}" height="16" fill="#2ca02c"/>')
        parts.append(f'<rect x="{170 + bw * (1 - stall):.1f}" y="{y}" width="{bw * stall:.1f}" height="16" fill="#d62728">'
                     f'<title>{100 * stall:.0f}% data wait</title></rect>')
        parts.append(f'<text x="{175 + bw}" y="{y + 13}" font-size="11">{100 * stall:.0f}% wait</text>')
    parts.append("</svg>")
    return "".join(parts)


def _timeline(cells, fw) -> str:
    w, h, pad = 720, 240, 40
    series = [(f"{s}/{n}", c["real"].get("utilization_timeline") or []) for (s, n, f), c in cells.items() if f == fw]
    series = [(k, v) for k, v in series if v]
    if not series:
        return ""
    tmax = max(p["t"] for _, v in series for p in v) or 1
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
    parts = [f'<svg class="chart" viewBox="0 0 {w} {h + 20 * ((len(series) + 3) // 4)}" width="{w}" role="img" '
             f'aria-label="CPU utilization">', f'<text x="{w / 2}" y="16" text-anchor="middle" font-weight="bold">'
             f'Machine CPU % over each run ({fw}), sampled ~1 Hz</text>',
             f'<line x1="{pad}" y1="{h - pad}" x2="{w - 10}" y2="{h - pad}" stroke="#444"/>',
             f'<line x1="{pad}" y1="30" x2="{pad}" y2="{h - pad}" stroke="#444"/>',
             f'<text x="5" y="35" font-size="10">100%</text><text x="5" y="{h - pad}" font-size="10">0%</text>']
    for i, (name, pts) in enumerate(series):
        color = palette[i % len(palette)]
        xy = " ".join(f"{pad + p['t'] / tmax * (w - pad - 10):.1f},{h - pad - p['cpu_percent'] / 100 * (h - pad - 30):.1f}"
                      for p in pts)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{xy}"><title>{html.escape(name)}</title></polyline>')
        parts.append(f'<text x="{pad + (i % 4) * 170}" y="{h + 5 + 20 * (i // 4)}" font-size="11" fill="{color}">{html.escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _md_to_html(md: str) -> str:
    """Enough Markdown for this report: headings, tables, bullets, bold, paragraphs."""
    import re

    out, table = [], []

    def inline(t):
        return re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", html.escape(t))

    def flush():
        if table:
            head, *body = [r for r in table if not re.fullmatch(r"\|[-| ]+\|", r)]
            cells = lambda r: [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", r.strip("|"))]  # noqa: E731
            out.append("<table><thead><tr>" + "".join(f"<th>{inline(c)}</th>" for c in cells(head)) + "</tr></thead><tbody>"
                       + "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in cells(r)) + "</tr>" for r in body)
                       + "</tbody></table>")
            table.clear()

    for line in md.splitlines():
        if line.startswith("|"):
            table.append(line)
            continue
        flush()
        if line.startswith("## "):
            out.append(f"<h2>{inline(line[3:])}</h2>")
        elif line.startswith("# "):
            out.append(f"<h1>{inline(line[2:])}</h1>")
        elif line.startswith("- "):
            out.append(f"<ul><li>{inline(line[2:])}</li></ul>")
        elif line.strip():
            out.append(f"<p>{inline(line)}</p>")
    flush()
    return "\n".join(out)


def _html(md: str, cells, stores, nodes, frameworks) -> str:
    charts = []
    for fw in frameworks:
        values = {(n, s): c["real"]["samples_per_s"] for (s, n, f), c in cells.items() if f == fw}
        charts.append(_bars(f"Training throughput per node and store ({fw}, samples/s, log scale)", nodes, stores, values))
        charts.append(_stall(cells, stores, nodes, fw))
        charts.append(_timeline(cells, fw))
    body = _md_to_html(md)
    split = body.find("<h2>Why")
    if split >= 0:
        body = body[:split] + '<h2>Charts</h2><div class="charts">' + "".join(charts) + "</div>" + body[split:]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>trainfeed storage A/B report</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 13px; }}
th, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }}
th {{ background: #f3f3f3; }}
.charts svg {{ display: block; margin: 1.5em 0; background: #fafafa; border: 1px solid #eee; }}
ul {{ margin: 0.2em 0; }}
</style></head><body>
{body}
</body></html>
"""
