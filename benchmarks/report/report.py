"""results.jsonl -> results.csv, costs.csv, report.md and report.html (the Markdown rendered by
markdown-it-py, matplotlib charts inline as SVG: one file, no network). The answer comes first,
then the A/B table, as in the whitepaper. This module reads the records and writes the files; markdown.py
writes the Markdown, html.py the page."""
from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from trainfeed.benchmarks.ab.results import load_results
from trainfeed.benchmarks.model.advice import Advice, Reference, build_advice, plan_for
from trainfeed.benchmarks.model.catalog import CATALOG, Instance, load_catalog, load_dbu_rates
from trainfeed.benchmarks.model.cost import Workload
from trainfeed.benchmarks.model.measured import STAGES
from trainfeed.benchmarks.model.projection import Loader
from trainfeed.benchmarks.model.scenario import SCENARIO_COPY, Scenario, load_scenario
from trainfeed.benchmarks.model.verdict import verdict
from trainfeed.benchmarks.records import CellKey, ProjectionRow, Record
from trainfeed.benchmarks.report import charts as charts_mod
from trainfeed.benchmarks.report.html import html
from trainfeed.benchmarks.report.markdown import markdown, markdown_nothing_measured
from trainfeed.benchmarks.report.sections.costs import catalog_markdown
from trainfeed.converters.errors import UsageError
from trainfeed.converters.redact import redact


def _cells(records: list[Record]) -> dict[CellKey, Record]:
    """The cells of the table, each with its verdict from this model, not the one recorded when
    it was measured: a report rebuilt after the model changed says what its projections say."""
    cells: dict[CellKey, Record] = {}
    for r in records:  # the last repeat of a cell wins the table; all stay in results.jsonl
        if r["kind"] == "cell":
            cells[(r["store"], r["node"], r["framework"])] = {**r, "verdict": verdict(r)}
    return cells


def _spread(records: list[Record]) -> dict[CellKey, list[float]]:
    """The real-run rates of every repeat of each cell."""
    rates: dict[CellKey, list[float]] = {}
    for r in records:
        if r["kind"] == "cell" and r["real"]["samples_per_s"]:
            rates.setdefault((r["store"], r["node"], r["framework"]), []).append(r["real"]["samples_per_s"])
    return rates


def _locations(records: list[Record]) -> list[Record]:
    """The location-effect measurements: one per run (merged results hold several)."""
    return [r for r in records if r["kind"] == "location-effect"]


def _failed(records: list[Record], cells: dict[CellKey, Record]) -> dict[tuple[str, str | None, str | None], Record]:
    """Failed cells, the last failure of each, unless a repeat of the cell was measured."""
    failed: dict[tuple[str, str | None, str | None], Record] = {}
    for r in records:
        key = (r["store"], r.get("node"), r.get("framework"))
        if r["kind"] == "error" and key not in cells:
            failed[key] = r
    return failed


def _failure_line(rec: Record) -> str:
    return redact(f"{rec['store']} x {rec.get('node') or '-'} {rec.get('framework') or '-'} "
                  f"({rec.get('stage', '?')}): {rec['error']}")


#: The ``--baseline-loader`` a report was given, kept in OUT for the reports rebuilt from it.
BASELINE_COPY = "baseline-loader.json"


def build(out: str, *, target_samples: int = 650_000, target_epochs: int = 5, catalog: Path = CATALOG,
          baseline: Loader | None = None, scenario: Scenario | None = None,
          my_instance: str | None = None) -> dict[str, Any]:
    """Write results.csv, costs.csv, report.md and report.html from OUT/results.jsonl (and, for a
    scenario run, OUT/reference.json); ``scenario`` defaults to the copy a scenario run left in
    OUT, ``baseline`` to the one the run's report was given (OUT/baseline-loader.json, written
    here); ``my_instance``: a catalog instance whose cost the report always shows."""
    records = load_results(out)
    outdir = Path(out)
    if scenario is None and (outdir / SCENARIO_COPY).is_file():
        scenario = load_scenario(outdir / SCENARIO_COPY)
    if baseline is not None:
        (outdir / BASELINE_COPY).write_text(json.dumps(asdict(baseline)) + "\n")
    elif (outdir / BASELINE_COPY).is_file():
        baseline = Loader(**json.loads((outdir / BASELINE_COPY).read_text()))
    cells = _cells(records)
    locations = _locations(records)
    errors = [r for r in records if r["kind"] == "error"]
    failed = _failed(records, cells)
    stores = charts_mod.store_order(k[0] for k in cells)
    nodes = list(dict.fromkeys(k[1] for k in cells))
    frameworks = list(dict.fromkeys(k[2] for k in cells))
    instances, notes = load_catalog(catalog)
    check_instance(my_instance, instances, catalog)
    advice: Advice | None = None
    catalog_md = ""
    _write_csv(outdir / "results.csv", cells.values(), failed.values())
    if cells:
        every = [r for r in records if r["kind"] == "cell"]  # every repeat: the model takes medians
        plan = plan_for(every, Workload(target_samples, target_epochs), baseline, scenario)
        dbu = {r.cloud: r for r in load_dbu_rates() if r.workload == "jobs"}
        advice = build_advice(every, instances, dbu, plan, stores)
        md = markdown(cells, _spread(records), locations, stores, nodes, advice, notes, errors,
                      my_instance)
        catalog_md = catalog_markdown(advice)
        _write_costs(outdir / "costs.csv", advice.projections)
        if advice.reference:
            _write_reference(outdir / "reference.json", advice.reference)
    else:
        md = markdown_nothing_measured(records, errors)
    (outdir / "report.md").write_text(md)
    (outdir / "report.html").write_text(html(md, cells, stores, nodes, frameworks, catalog_md))
    return {"report_md": str(outdir / "report.md"), "report_html": str(outdir / "report.html"),
            "results_csv": str(outdir / "results.csv"),
            "costs_csv": str(outdir / "costs.csv") if cells else None, "cells": len(cells), "errors": len(errors),
            "failed_cells": len(failed), "first_error": _failure_line(errors[0]) if errors else None,
            "recommendation": advice.recommendation.to_json() if advice and advice.recommendation else None,
            "reference": advice.reference.rows if advice and advice.reference else None}


def check_instance(name: str | None, instances: list[Instance], catalog: Path) -> None:
    """``--my-instance NAME`` names an instance of the catalog (a usage error otherwise, naming the nearest)."""
    if name is None or any(i.name == name for i in instances):
        return
    import difflib

    near = difflib.get_close_matches(name, [i.name for i in instances], n=3)
    raise UsageError(f"--my-instance {name}: not in the catalog {catalog}"
                     + (f"; did you mean {', '.join(near)}?" if near else "; `storage-bench prices` lists it"))


def _write_reference(path: Path, ref: Reference) -> None:
    """reference.json: every cell the scenario gives a published time for, projected beside it."""
    rows = [{"node": r["node"], "store": r["store"], "projected_s": r["projected_s"], "reference_s": r["reference_s"]}
            for r in ref.rows]
    path.write_text(json.dumps(rows, indent=1) + "\n")


CSV_COLUMNS = ["store", "node", "framework", "node_kind", "storage", "storage_profile", "reader_workers",
               "io_concurrency", "compute_only_samples_per_s", "compute_how",
               "ingest_only_samples_per_s", "samples_per_s", "mb_per_s", "stall_fraction", "au",
               "cpu_percent_mean", "rss_mb_max", "image_storage", "read_cpu_ms", "decode_cpu_ms", "augment_cpu_ms",
               "reader_cpu_ms_per_sample", "contended", "bottleneck", "advice", "failed_stage", "error"]


def _write_csv(path: Path, cells: Iterable[Record], failed: Iterable[Record]) -> None:
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
                        *_stage_ms(c.get("stages")), _ms(c["ingest_only"].get("cpu_s_per_sample")),
                        any("contention" in n for n in c.get("checks", [])), c["verdict"]["bottleneck"],
                        c["verdict"]["advice"], "", ""])
        for e in failed:
            row = dict.fromkeys(CSV_COLUMNS, "")
            row.update(store=e["store"], node=e.get("node") or "", framework=e.get("framework") or "",
                       failed_stage=e.get("stage", ""), error=redact(e["error"]))
            w.writerow(row.values())


COST_COLUMNS = ["option", "store", "loader", "cloud", "region", "instance", "vcpus", "vcpus_needed", "gpus", "device",
                "device_how", "samples_per_s", "seconds", "usd_per_hour", "usd_per_job", "spot_usd_per_hour",
                "spot_usd_per_job", "usd_per_1k_samples", "time_vs_fastest", "cost_vs_cheapest", "fastest", "cheapest",
                "bottleneck", "ram_note", "price_date", "price_source"]


def _write_costs(path: Path, projections: dict[str, list[ProjectionRow]]) -> None:
    """costs.csv: every option on every instance of the catalog, as the model projects it (the
    report shows the few rows that matter)."""
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(COST_COLUMNS)
        for rows in projections.values():
            for r in rows:
                w.writerow([r.get("machine") if k == "instance" else r.get(k) for k in COST_COLUMNS])


def _ms(seconds: float | None) -> float | str:
    return "" if seconds is None else seconds * 1e3


def _stage_ms(stages: dict[str, float] | None) -> list[float | str]:
    """An image cell's CPU milliseconds per sample of each stage (read, decode, augment)."""
    return [stages[s] * 1e3 for s in STAGES] if stages else ["", "", ""]

