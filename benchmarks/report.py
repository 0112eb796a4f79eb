"""results.jsonl -> results.csv, report.md and report.html (the Markdown rendered by
markdown-it-py, matplotlib charts inline as SVG: one file, no network). The A/B table comes
first, as in the whitepaper."""
from __future__ import annotations

import csv
from datetime import datetime, timezone
from pathlib import Path

from markdown_it import MarkdownIt

from trainfeed.converters.redact import redact

from . import charts as charts_mod
from .cost import CATALOG, load_catalog, project, recommend
from .matrix import load_results
from .stages import STAGES


def _cells(records):
    cells = {}
    for r in records:  # the last repeat of a cell wins the table; all stay in results.jsonl
        if r["kind"] == "cell":
            cells[(r["store"], r["node"], r["framework"])] = r
    return cells


def _locations(records) -> list[dict]:
    """The location-effect measurements: one per run (merged results hold several)."""
    return [r for r in records if r["kind"] == "location-effect"]


def _storage_key(cell) -> tuple:
    """Where a cell read from and with which connection budget: cells compared for the layout
    effect must share it."""
    return cell["storage"]["backend"], cell["storage"]["profile"], tuple(sorted(cell["connections"].items()))


def _place(rec) -> str:
    st = rec["storage"]
    return f"{st['backend']} storage, " + (f"emulated {st['profile']} latency" if st["profile"] else "no latency emulation")


def _budget(rec) -> str:
    conn = rec["connections"]
    requests = f", {conn['io_concurrency']} requests in flight" if conn["io_concurrency"] else " (local reads)"
    return f"{conn['reader_workers']} reader workers{requests}"


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
    locations = _locations(records)
    errors = [r for r in records if r["kind"] == "error"]
    failed = _failed(records, cells)
    stores = charts_mod.store_order(k[0] for k in cells)
    nodes = list(dict.fromkeys(k[1] for k in cells))
    frameworks = list(dict.fromkeys(k[2] for k in cells))
    instances, notes = load_catalog(catalog)
    projections = {s: project(list(cells.values()), instances, s, target_samples=target_samples, epochs=target_epochs)
                   for s in stores}
    rec = recommend(projections)
    outdir = Path(out)
    _write_csv(outdir / "results.csv", cells.values(), failed.values())
    if cells:
        md = _markdown(cells, locations, stores, nodes, frameworks, projections, rec, notes, errors, target_samples,
                       target_epochs)
    else:
        md = _markdown_nothing_measured(records, errors)
    (outdir / "report.md").write_text(md)
    (outdir / "report.html").write_text(_html(md, cells, stores, nodes, frameworks))
    return {"report_md": str(outdir / "report.md"), "report_html": str(outdir / "report.html"),
            "results_csv": str(outdir / "results.csv"), "cells": len(cells), "errors": len(errors),
            "failed_cells": len(failed), "first_error": _failure_line(errors[0]) if errors else None,
            "recommendation": rec}


CSV_COLUMNS = ["store", "node", "framework", "node_kind", "storage", "storage_profile", "reader_workers",
               "io_concurrency", "compute_only_samples_per_s", "compute_how",
               "ingest_only_samples_per_s", "samples_per_s", "mb_per_s", "stall_fraction", "au",
               "cpu_percent_mean", "rss_mb_max", "image_storage", "read_cpu_ms", "decode_cpu_ms", "augment_cpu_ms",
               "bottleneck", "advice", "failed_stage", "error"]


def _write_csv(path: Path, cells, failed) -> None:
    """One row per measured cell, then one per failed cell (its stage and error, no measures)."""
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_COLUMNS)
        for c in cells:
            u = c["real"].get("utilization", {})
            w.writerow([c["store"], c["node"], c["framework"], c.get("node_kind"), c["storage"]["backend"],
                        c["storage"]["profile"] or "none", c["connections"]["reader_workers"],
                        c["connections"]["io_concurrency"], c["compute_only"]["samples_per_s"],
                        c["compute_only"]["how"], c["ingest_only"]["samples_per_s"], c["real"]["samples_per_s"],
                        c["real"]["mb_per_s"], c["real"]["stall_fraction"], c["real"]["au"],
                        u.get("cpu_percent_mean"), u.get("rss_mb_max"), c.get("image_storage") or "",
                        *_stage_ms(c.get("stages")), c["verdict"]["bottleneck"],
                        c["verdict"]["advice"], "", ""])
        for e in failed:
            row = dict.fromkeys(CSV_COLUMNS, "")
            row.update(store=e["store"], node=e.get("node") or "", framework=e.get("framework") or "",
                       failed_stage=e.get("stage", ""), error=redact(e["error"]))
            w.writerow(row.values())


def _stage_ms(stages: dict | None) -> list:
    """An image cell's CPU milliseconds per sample of each stage (read, decode, augment)."""
    return [stages[s] * 1e3 for s in STAGES] if stages else ["", "", ""]


def _markdown(cells, locations, stores, nodes, frameworks, projections, rec, notes, errors, target, epochs) -> str:
    any_cell = next(iter(cells.values()))
    env = any_cell["env"]
    same_storage = len({_storage_key(c) for c in cells.values()}) == 1
    lines = ["# Storage A/B report", "",
             f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC · machine: {env['cores']} vCPUs, {env['ram_gb']} GB RAM, "
             f"GPU: {env['gpu'] or 'none'} · samples {'x'.join(map(str, any_cell['sample_shape']))} "
             f"({any_cell['sample_bytes'] / 1e3:.0f} KB) · batch {any_cell['batch_size']} · model ResNet-18 width "
             f"{any_cell['width']} · every store read from: "
             + (f"{_place(any_cell)}; {_budget(any_cell)}" if same_storage else "different storage or budgets (see each cell)"),
             "", f"## Training time for {target:,} samples x {epochs} epochs", "",
             "Projected from the rate measured in each cell (real run: the reader feeding the step). "
             "Emulated nodes compute for the profile's step time (\"estimate\": from FLOPs and the datasheet peak).", ""]
    for fw in frameworks:
        lines += [f"**{fw}**", "", "| node | " + " | ".join(stores) + " | layout effect: compacted vs blob |",
                  "|---|" + "---|" * (len(stores) + 1)]
        for node in nodes:
            row, rates, row_cells = [], {}, []
            label = None
            for s in stores:
                c = cells.get((s, node, fw))
                if c is None:
                    row.append("-")
                    continue
                label = label or _node_label(c)
                row_cells.append(c)
                rates[s] = c["real"]["samples_per_s"]
                row.append(f"{_hours(target, epochs, rates[s])} ({rates[s]:,.0f}/s)")
            best = max((rates[s] for s in rates if s != "blob"), default=None)
            ratio = f"{best / rates['blob']:.1f}x faster" if best and rates.get("blob") else "-"
            if ratio != "-" and len({_storage_key(c) for c in row_cells}) > 1:
                ratio += " (mixes location and layout)"
            lines.append(f"| {label or node} | " + " | ".join(row) + f" | {ratio} |")
        lines.append("")
    lines += _effects(cells, locations, same_storage)
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


def _effects(cells, locations, same_storage: bool) -> list[str]:
    """The layout effect (compacted vs small files, same storage, same connection budget) and
    the location effect (the same compacted store on that storage vs on local disk), each from
    ingest-only rates; a comparison that mixes the two says so."""
    ingest = {c["store"]: c["ingest_only"]["samples_per_s"] or 0 for c in cells.values()}
    lines = ["## Layout effect and location effect", ""]
    compacted = {s: r for s, r in ingest.items() if s != "blob"}
    if compacted and ingest.get("blob"):
        best = max(compacted, key=compacted.get)
        figures = (f"ingest-only, the best compacted store ({best}) {compacted[best]:,.0f} samples/s, the small files "
                   f"{ingest['blob']:,.0f} samples/s: **{compacted[best] / ingest['blob']:.1f}x**")
        if same_storage:
            any_cell = next(iter(cells.values()))
            lines.append(f"- **Layout effect** (compacted vs small files, both on {_place(any_cell)}, both read with "
                         f"{_budget(any_cell)}): {figures}. Per node, in the real run: the table's last column.")
        else:
            lines.append("- **Compacted vs small files, mixing location and layout**: the cells were read from "
                         f"different storage or with different connection budgets, so this is not the layout effect "
                         f"alone: {figures}.")
    for loc in locations:
        local, remote = loc["local_disk"]["samples_per_s"], loc["on_storage"]["samples_per_s"]
        lines.append(f"- **Location effect** (the same {loc['store']} store, both read with {_budget(loc)}): ingest-only "
                     f"from local disk as it is {local:,.0f} samples/s, from {_place(loc)}: {remote:,.0f} samples/s: "
                     f"**{local / remote:.1f}x** faster on local disk.")
    if not locations:
        lines.append("- **Location effect**: not measured (the cells read local disk as it is, with no latency "
                     "emulation; or its measurement failed: see the failures below).")
    return lines + [""]


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


# ------------------------------------------------------------------ HTML

#: CommonMark plus tables; raw HTML in the Markdown (an error message, say) is shown, not run.
_MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable("table")


def _html(md: str, cells, stores, nodes, frameworks) -> str:
    charts = [draw(cells, stores, nodes, fw) for fw in frameworks
              for draw in (charts_mod.throughput, charts_mod.stall, charts_mod.utilization)]
    body = _MARKDOWN.render(md)
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
.charts svg {{ display: block; margin: 1.5em 0; max-width: 100%; height: auto; }}
ul {{ margin: 0.2em 0; }}
</style></head><body>
{body}
</body></html>
"""
