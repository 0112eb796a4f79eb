"""The measured sections: the layout and location effects from the ingest-only rates, and the
table of every cell with its notes written once as footnotes."""
from __future__ import annotations

import re

from trainfeed.benchmarks.model.measured import layout_of, loader_of, machine_of, storage_of
from trainfeed.benchmarks.model.projection import project
from trainfeed.benchmarks.model.verdict import doubts, too_short
from trainfeed.benchmarks.records import CellKey, Record
from trainfeed.benchmarks.report.answer import location_doubt
from trainfeed.benchmarks.report.formatting import budget, fmt_num, place

#: An ingest-only pass that read only its warm-up batch has no rate (verdict.too_short says why).
NOT_TIMED = "not timed (too few batches)"


def effects_section(cells: dict[CellKey, Record], locations: list[Record], same_storage: bool) -> list[str]:
    """The layout effect (compacted vs small files, same storage, same connection budget) and
    the location effect (the same compacted store on that storage vs on local disk), each from
    ingest-only rates; a comparison that mixes the two says so. A rate too short to mean
    anything, or an effect the model's physics rule out, is reported as such with the reason,
    never as a ratio."""
    ingest = {c["store"]: c["ingest_only"] for c in cells.values()}
    rate = {s: m["samples_per_s"] or 0 for s, m in ingest.items()}
    lines = ["## Layout effect and location effect", ""]
    compacted = {s: r for s, r in rate.items() if s != "blob"}
    if compacted and "blob" in rate:
        best = max(compacted, key=compacted.__getitem__)
        short = next(((s, why) for s in ("blob", best) if (why := too_short(ingest[s]))), None)
        any_cell = next(iter(cells.values()))
        name = ("Layout effect** (compacted vs small files, both on "
                f"{place(any_cell)}, both read with {budget(any_cell)})" if same_storage else
                "Compacted vs small files, mixing location and layout**")
        if short:
            lines.append(f"- **{name}: not measured: the ingest-only read of {short[0]} was {short[1]}; the "
                         "projections use the reader's CPU time per sample and the storage model instead.")
        elif same_storage:
            lines.append(f"- **{name}: ingest-only, the best compacted store ({best}) {compacted[best]:,.0f} "
                         f"samples/s, the small files {rate['blob']:,.0f} samples/s: "
                         f"**{fmt_num(compacted[best] / rate['blob'], 2)}x**. Per node, projected: the gains under the "
                         "headline.")
        else:
            lines.append(f"- **{name}: the cells were read from different storage or with different connection "
                         f"budgets, so this is not the layout effect alone: ingest-only, the best compacted store "
                         f"({best}) {compacted[best]:,.0f} samples/s, the small files {rate['blob']:,.0f} samples/s: "
                         f"**{fmt_num(compacted[best] / rate['blob'], 2)}x**.")
    for loc in locations:
        local, remote = loc["local_disk"]["samples_per_s"], loc["on_storage"]["samples_per_s"]
        if not local or not remote:
            lines.append(f"- **Location effect** ({loc['store']}): too few batches to time (raise --steps or "
                         "use more samples).")
            continue
        doubt = location_doubt(loc)
        if doubt:
            lines.append(f"- **Location effect** ({loc['store']}): not measured reliably: {doubt}. Left out of the "
                         "answer.")
            continue
        lines.append(f"- **Location effect** (the same {loc['store']} store, both read with {budget(loc)}): "
                     f"ingest-only from local disk as it is {local:,.0f} samples/s, from {place(loc)}: "
                     f"{remote:,.0f} samples/s: **{fmt_num(local / remote, 2)}x** faster on local disk.")
    if not locations:
        lines.append("- **Location effect**: not measured (the cells read local disk as it is, with no latency "
                     "emulation; or its measurement failed: see the failures below).")
    return [*lines, ""]


def _general(note: str) -> tuple[str, str]:
    """A cell's note as (what it means, this cell's figures): "real run measured under contention
    (other processes used 53% ...): wall rates ..." is the footnote "real run measured under
    contention: wall rates ..." and the figures "(other processes used 53% ...)" stay in the cell,
    so a note that differs only by its figures is written once."""
    figures = re.findall(r" \(([^()]*\d[^()]*)\)", note)
    return re.sub(r" \([^()]*\d[^()]*\)", "", note), f"({'; '.join(figures)})" if figures else ""


def cells_section(cells: dict[CellKey, Record], spread: dict[CellKey, list[float]], nodes: list[str],
                  stores: list[str]) -> list[str]:
    lines = ["## Why: each cell", "",
             "Measured here: compute-only, ingest-only and the real run (samples/s, wall clock); the reader's CPU "
             "per sample (process CPU time); what the model allows this machine; the verdict from the model's "
             "binding constraint.", "",
             "| store | node | fw | compute-only /s | ingest-only /s | real /s | read CPU ms/sample | model /s | stall "
             "| bottleneck | advice | notes |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    footnotes: dict[str, int] = {}  # a note repeated across cells is written once, under the table
    for (s, n, fw), c in sorted(cells.items(), key=lambda kv: (nodes.index(kv[0][1]), stores.index(kv[0][0]))):
        proj = project(machine_of(c), layout_of(c), loader_of(c), storage_of(c), c["batch_size"])
        r = c["real"]
        cpu = c["ingest_only"].get("cpu_s_per_sample")
        marks = []
        for note in [*c.get("checks", []), *doubts(c)]:
            general, figures = _general(note)
            marks.append(f"[{footnotes.setdefault(general, len(footnotes) + 1)}]" + (f" {figures}" if figures else ""))
        notes = ", ".join(marks).replace("|", "\\|") or "-"
        runs = spread.get((s, n, fw), [])
        real = f"{r['samples_per_s']:,.0f}" + (f" ({min(runs):,.0f}-{max(runs):,.0f} over {len(runs)} repeats)"
                                               if len(runs) > 1 else "")
        ingest = c["ingest_only"]["samples_per_s"]
        lines.append(f"| {s} | {n} | {fw} | {c['compute_only']['samples_per_s']:,.0f} ({c['compute_only']['how']}) | "
                     f"{f'{ingest:,.0f}' if ingest else NOT_TIMED} | {real} | "
                     f"{'-' if cpu is None else f'{cpu * 1e3:.2f}'} | {proj.samples_per_s:,.0f} | "
                     f"{100 * r['stall_fraction']:.0f}% | {c['verdict']['bottleneck']} | {c['verdict']['advice']} | "
                     f"{notes} |")
    lines.append("")
    if footnotes:
        lines += ["Notes:", ""] + [f"- [{m}] " + note.replace("|", "\\|") for note, m in footnotes.items()] + [""]
    return lines

