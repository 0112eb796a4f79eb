"""report.md: the Markdown of a report, section by section: first the answer (answer.py: what to
do, its time and cost, how sure, what binds) and the headline, then the reference case, feeds,
effects, cells, the costs that matter, remedies, method, failures (each in sections/); or of a
run that measured nothing."""
from __future__ import annotations

from datetime import UTC, datetime

from trainfeed.benchmarks.model.advice import Advice
from trainfeed.benchmarks.records import CellKey, Record
from trainfeed.benchmarks.report.answer import answer
from trainfeed.benchmarks.report.formatting import budget, place
from trainfeed.benchmarks.report.sections.costs import costs_section, remedies_section
from trainfeed.benchmarks.report.sections.measured import cells_section, effects_section
from trainfeed.benchmarks.report.sections.method import method_section
from trainfeed.benchmarks.report.sections.projected import feeds_section, headline_section
from trainfeed.benchmarks.report.sections.reference import reference_section
from trainfeed.converters.redact import redact


def _storage_key(cell: Record) -> tuple[str, str | None, tuple[tuple[str, int | None], ...]]:
    """Where a cell read from and with which connection budget: cells compared for the layout
    effect must share it."""
    return cell["storage"]["backend"], cell["storage"]["profile"], tuple(sorted(cell["connections"].items()))


def markdown(cells: dict[CellKey, Record], spread: dict[CellKey, list[float]], locations: list[Record],
             stores: list[str], nodes: list[str], advice: Advice, notes: list[str], errors: list[Record],
             my_instance: str | None = None) -> str:
    """report.md of a run that measured at least one cell."""
    any_cell = next(iter(cells.values()))
    env = any_cell["env"]
    plan = advice.plan
    same_storage = len({_storage_key(c) for c in cells.values()}) == 1
    lines = ["# Storage A/B report", "",
             f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC · machine: {env['cores']} vCPUs, "
             f"{env['ram_gb']} GB RAM, GPU: {env['gpu'] or 'none'} · samples "
             f"{'x'.join(map(str, any_cell['sample_shape']))} "
             f"({any_cell['sample_bytes'] / 1e3:.0f} KB) · batch {any_cell['batch_size']} · model ResNet-18 width "
             f"{any_cell['width']} · every store read from: "
             + (f"{place(any_cell)}; {budget(any_cell)}" if same_storage
                else "different storage or budgets (see each cell)"),
             ""]
    contended = [c for c in cells.values() if any("contention" in n for n in c.get("checks", []))]
    lines += answer(advice, cells, locations, contended)
    lines += headline_section(advice)
    if contended:
        lines += [f"> **Measured under contention**: {len(contended)} of {len(cells)} cells ran while other processes "
                  "or the hypervisor took CPU (see each cell's notes). Wall-clock rates of those cells are low and "
                  "noisy; the projections use CPU time per sample, which contention distorts far less. Rerun on an "
                  "idle machine to confirm.", ""]
    if plan.scenario is not None:
        lines += reference_section(advice)
    lines += feeds_section(advice)
    lines += effects_section(cells, locations, same_storage)
    lines += cells_section(cells, spread, nodes, stores)
    lines += costs_section(advice, my_instance)
    lines += remedies_section(advice)
    lines += method_section(advice, notes)
    lines += _failures_section(errors)
    return "\n".join(lines) + "\n"


def _failures_section(errors: list[Record]) -> list[str]:
    if not errors:
        return []
    lines = ["## Cells that failed", "", "| store | node | fw | repeat | stage | error |", "|---|---|---|---|---|---|"]
    for e in errors:
        message = redact(e["error"]).replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {e['store']} | {e.get('node') or '-'} | {e.get('framework') or '-'} | "
                     f"{e.get('repeat', '-')} | {e.get('stage', '-')} | {message} |")
    return [*lines, ""]


def markdown_nothing_measured(records: list[Record], errors: list[Record]) -> str:
    """report.md of a run whose every cell failed: the failures and their reasons."""
    env = next((r["env"] for r in records if r.get("env")), None)
    machine = f" · machine: {env['cores']} vCPUs, {env['ram_gb']} GB RAM, GPU: {env['gpu'] or 'none'}" if env else ""
    lines = ["# Storage A/B report", "",
             f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC{machine}", "",
             f"**No cell was measured**: all {len(errors)} failed, so there is nothing to compare or project. "
             "Each failure and its reason:", ""]
    return "\n".join(lines + _failures_section(errors))
