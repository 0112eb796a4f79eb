"""report.md: the Markdown of a report, section by section (reference case, headline, feeds,
effects, cells, costs, remedies, recommendation, method, failures), or of a run that measured nothing."""
from __future__ import annotations

from datetime import datetime, timezone

from trainfeed.converters.redact import redact

from trainfeed.benchmarks.model.cost import Spot
from trainfeed.benchmarks.model.measured import layout_of, loader_of, machine_of, storage_of
from trainfeed.benchmarks.model.projection import project
from trainfeed.benchmarks.model.profiles import IO_CPU_SOURCE
from trainfeed.benchmarks.report.formatting import budget, fmt_rate, fmt_time, fmt_usd, place


def _storage_key(cell) -> tuple:
    """Where a cell read from and with which connection budget: cells compared for the layout
    effect must share it."""
    return cell["storage"]["backend"], cell["storage"]["profile"], tuple(sorted(cell["connections"].items()))


def markdown(cells, spread, locations, stores, nodes, frameworks, advice, notes, errors) -> str:
    any_cell = next(iter(cells.values()))
    env = any_cell["env"]
    plan = advice["plan"]
    same_storage = len({_storage_key(c) for c in cells.values()}) == 1
    lines = ["# Storage A/B report", "",
             f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC · machine: {env['cores']} vCPUs, {env['ram_gb']} GB RAM, "
             f"GPU: {env['gpu'] or 'none'} · samples {'x'.join(map(str, any_cell['sample_shape']))} "
             f"({any_cell['sample_bytes'] / 1e3:.0f} KB) · batch {any_cell['batch_size']} · model ResNet-18 width "
             f"{any_cell['width']} · every store read from: "
             + (f"{place(any_cell)}; {budget(any_cell)}" if same_storage else "different storage or budgets (see each cell)"),
             ""]
    contended = [c for c in cells.values() if any("contention" in n for n in c.get("checks", []))]
    if contended:
        lines += [f"> **Measured under contention**: {len(contended)} of {len(cells)} cells ran while other processes "
                  "or the hypervisor took CPU (see each cell's notes). Wall-clock rates of those cells are low and "
                  "noisy; the projections use CPU time per sample, which contention distorts far less. Rerun on an "
                  "idle machine to confirm.", ""]
    if plan.scenario is not None:
        lines += _reference_section(advice)
    lines += _headline(advice)
    lines += _feeds_section(advice)
    lines += _effects(cells, locations, same_storage)
    lines += _cells_section(cells, spread, nodes, stores)
    lines += _costs_section(advice)
    lines += _remedies_section(advice)
    lines += _recommendation(advice)
    lines += _method(advice, notes)
    lines += _failures_section(errors)
    return "\n".join(lines) + "\n"


def _deviation(d: float | None) -> str:
    return "-" if d is None else f"{d:+.0%}"


def _reference_section(advice) -> list[str]:
    ref, sc = advice["reference"], advice["plan"].scenario
    lines = [f"## Reference case: {sc.name}", "",
             f"Scenario `{sc.path}`. Published times beside this run's projections for the same workload "
             f"({sc.workload.total:,} samples, batch {sc.batch_size}); the model is the one every table below uses.", "",
             "| node | store, loader | projected | published | deviation | bottleneck | $/h | $ projected | "
             "$ at the published time |", "|---|---|---|---|---|---|---|---|---|"]
    for r in ref["rows"]:
        lines.append(f"| {r['node']} | {r['store']}, {sc.loader_for(r['store']).name} | {fmt_time(r['projected_s'])} | "
                     f"{fmt_time(r['reference_s'])} | {_deviation(r['deviation'])} | {r['bottleneck'] or '-'} | "
                     f"{fmt_usd(r['usd_per_hour'])} | {fmt_usd(r['projected_usd'])} | {fmt_usd(r['reference_usd'])} |")
    lines += ["", "| node | speed-up published | projected | deviation |", "|---|---|---|---|"]
    for s in ref["speedups"]:
        lines.append(f"| {s['node']} | {s['published']:.2g}x | {s['projected']:.2g}x | {_deviation(s['deviation'])} |")
    verdict = ("every figure within 25% of the paper" if ref["within_25pct"] else
               "not every figure is within 25% of the paper: see below which knob decides each")
    lines += ["", f"**{verdict}.**", ""]
    for x in ref["cross_checks"]:
        what = "CPU-seconds per step" if x["device"] == "cpu" else "seconds per step"
        lines.append(f"- **{x['node']}**: its compacted run is compute-bound, so its published time implies the "
                     f"device: {x['implied_step_s']:.3g} {what} where this projection used {x['step_s']:.3g} "
                     f"({x['device']}, {x['device_how']}), {x['slower']:.2g}x slower. With that device the small "
                     f"files project to {fmt_time(x['blob_projected_s'])} against {fmt_time(x['blob_reference_s'])} "
                     f"published ({_deviation(x['blob_deviation'])}): the storage and loader side of the model holds; "
                     "the device's speed is the knob (`storage-bench calibrate` on the real node measures it).")
    lines += ["", "Knobs and their sources:", ""]
    lines += [f"- {k}: {v}" for k, v in ref["sources"].items()]
    lines += ["- accelerator step time: " + "; ".join(sorted({f"{r['device']} {r['device_how']}"
                                                          for h in advice["headline"] for r in h["rows"]})), ""]
    return lines


def _headline(advice) -> list[str]:
    plan = advice["plan"]
    w = plan.workload
    lines = [f"## Training time for {w.samples:,} samples x {w.epochs} epochs", "",
             "Projected by one model from the quantities measured here (see \"How the projections were made\"); "
             "the bottleneck is the resource that binds. The fastest option on each node is in bold.", ""]
    opts = [o.label for o in advice["options"]]
    lines += ["| node | " + " | ".join(opts) + " |", "|---|" + "---|" * len(opts)]
    for h in advice["headline"]:
        rows = {r["option"]: r for r in h["rows"]}
        cells = []
        for o in opts:
            r = rows.get(o)
            text = f"{fmt_time(r['seconds'])} ({fmt_rate(r['samples_per_s'])}/s, {r['bottleneck']})" if r else "-"
            cells.append(f"**{text}**" if r and r.get("fastest") else text)
        label = f"{h['node']} ({h['instance']})" if h.get("instance") else h["rows"][0]["machine"] if h["rows"] else h["node"]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    for g in filter(None, advice["gains"]):
        text = (f"- **{g['node']}**: repacking ({g['repacked']}) is **{g['repack_gain']:.2g}x** faster than "
                f"{g['today']} ({fmt_time(g['repacked_s'])} vs {fmt_time(g['today_s'])})")
        if g["better_loading"]:
            text += f"; better loading alone ({g['better_loading']}) would be {g['better_loading_gain']:.2g}x"
        lines.append(text + ".")
    return lines + [""]


def _feeds_section(advice) -> list[str]:
    """Per GPU: the GB/s it reads at its own rate and the vCPUs busy feeding it (model.feed)."""
    if not advice["feeds"]:
        return []
    storage = advice["plan"].storage
    where = storage.name if storage else "local disk"
    io = (f"the storage client's I/O CPU (GB/s x CPU-s per GB at the loader's requests in flight: "
          f"{storage.io_cpu_source})" if storage else
          "no I/O CPU apart (local reads are in the reader's measured CPU)")
    opts = [o.label for o in advice["options"]]
    lines = [f"## vCPUs to feed one GPU from {where}", "",
             f"One GPU at its own rate (samples/s from its step time) reading each option from {where}: the GB/s it "
             f"takes and the vCPUs busy for it: {io}, decode (the reader's CPU per sample, measured here) and the "
             "framework's host work (measured on a real GPU; 0 for an emulated or estimated one, whose step sleeps). "
             "The model's `io-cpu`, `decode` and remedies use the same figures.", "",
             "| GPU | " + " | ".join(opts) + " |", "|---|" + "---|" * len(opts)]
    for row in advice["feeds"]:
        d = row["device"]
        first = next(iter(row["feeds"].values()))
        cells = []
        for o in opts:
            f = row["feeds"][o]
            per_gb = f" at {f.io_cpu_s_per_gb:.2f} CPU-s/GB" if storage else ""
            cells.append(f"{f.gb_per_s:.2g} GB/s{per_gb}: {f.describe()}")
        lines.append(f"| {d.name} ({d.how}, {fmt_rate(first.samples_per_s)} samples/s) | " + " | ".join(cells) + " |")
    return lines + [""]


def _cells_section(cells, spread, nodes, stores) -> list[str]:
    lines = ["## Why: each cell", "",
             "Measured here: compute-only, ingest-only and the real run (samples/s, wall clock); the reader's CPU "
             "per sample (process CPU time); what the model allows this machine; the verdict from the model's "
             "binding constraint.", "",
             "| store | node | fw | compute-only /s | ingest-only /s | real /s | read CPU ms/sample | model /s | stall "
             "| bottleneck | advice | notes |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (s, n, fw), c in sorted(cells.items(), key=lambda kv: (nodes.index(kv[0][1]), stores.index(kv[0][0]))):
        proj = project(machine_of(c), layout_of(c), loader_of(c), storage_of(c), c["batch_size"])
        r = c["real"]
        cpu = c["ingest_only"].get("cpu_s_per_sample")
        notes = "; ".join(c.get("checks", [])).replace("|", "\\|") or "-"
        runs = spread.get((s, n, fw), [])
        real = f"{r['samples_per_s']:,.0f}" + (f" ({min(runs):,.0f}-{max(runs):,.0f} over {len(runs)} repeats)"
                                               if len(runs) > 1 else "")
        lines.append(f"| {s} | {n} | {fw} | {c['compute_only']['samples_per_s']:,.0f} ({c['compute_only']['how']}) | "
                     f"{c['ingest_only']['samples_per_s'] or 0:,.0f} | {real} | "
                     f"{'-' if cpu is None else f'{cpu * 1e3:.2f}'} | {proj.samples_per_s:,.0f} | "
                     f"{100 * r['stall_fraction']:.0f}% | {c['verdict']['bottleneck']} | {c['verdict']['advice']} | "
                     f"{notes} |")
    return lines + [""]


def _costs_section(advice) -> list[str]:
    lines = ["## What it costs", "",
             "Per instance of the catalog, the same model. $/h is the instance's price per hour (plus Databricks "
             "DBUs where the catalog has them); per job is the whole workload. **Bold**: the fastest and the "
             "cheapest. Spot per job includes restarts after preemption (see below).", ""]
    for label, rows in advice["projections"].items():
        if not rows:
            continue
        lines += [f"**{label}**", "",
                  "| instance | vCPUs | GPUs | samples/s | time | $/h | $ per job | spot $ per job | $ per 1k samples "
                  "| time vs fastest | cost vs cheapest | bottleneck | price date |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            name = f"{r['cloud']} {r['machine']}"
            marks = [m for m in ("fastest", "cheapest") if r.get(m)]
            if marks:
                name = f"**{name}** ({', '.join(marks)})"
            gpus = f"{r['gpus']} {r['device']}" if r["gpus"] else "-"
            cv = f"{r['cost_vs_cheapest']:.2g}" if r["cost_vs_cheapest"] else "-"
            vcpus = f"{r['vcpus']}" + (f" (needs {r['vcpus_needed']})" if (r.get("vcpus_needed") or 0) > r["vcpus"]
                                       else "")
            lines.append(f"| {name} | {vcpus} | {gpus} | {fmt_rate(r['samples_per_s'])} | {fmt_time(r['seconds'])} | "
                         f"{fmt_usd(r['usd_per_hour'])} | {fmt_usd(r['usd_per_job'])} | {fmt_usd(r['spot_usd_per_job'])} | "
                         f"{fmt_usd(r['usd_per_1k_samples'])} | {r['time_vs_fastest']:.2g} | {cv} | {_limit(r)} | "
                         f"{r.get('price_date') or '-'} |")
        lines.append("")
    return lines


def _remedies_section(advice) -> list[str]:
    """Per GPU instance bound by its vCPUs (decode or I/O CPU): the vCPUs it needs, and three remedies
    with time and cost."""
    if not advice["remedies"]:
        return []
    lines = ["## The preprocessing bottleneck: remedies", "",
             "Where the instance's vCPUs cannot keep its GPUs busy (decoding encoded images, or the storage client's "
             "I/O CPU): the vCPUs this pipeline needs at the GPUs' rate (I/O, decode and the framework), and three "
             "remedies projected with the same model — an instance "
             "with enough vCPUs per GPU and reader threads (`--workers`) to use them, storing decoded pixels (more bytes, no "
             "decode), and offloading reading and preprocessing to CPU instances running tf.data service workers "
             "(`train --data-service`; TensorFlow's decode costs ~2.7x Pillow's CPU per image, `make "
             "bench-decode`). Times and $ per job (on demand).", ""]
    for store, rows in advice["remedies"].items():
        lines += [f"**{store}**", "", "| instance | today | vCPUs / needed | larger CPU:GPU instance | decoded pixels | "
                  "offload to CPU workers |", "|---|---|---|---|---|---|"]
        for fix in rows:
            t = fix["today"]
            lines.append(f"| {t['cloud']} {t['machine']} | {_when(t)} | {t['vcpus']} / {fix['vcpus_needed']} | "
                         + (f"{fix['bigger']['machine']} --workers {fix['bigger']['workers']}: {_when(fix['bigger'])}"
                            if fix["bigger"] else "none in the catalog")
                         + " | " + (_when(fix["decoded"]) if fix["decoded"] else "not measured (--image-storage decoded)")
                         + " | " + (f"{fix['offload']['workers']} x {fix['offload']['worker']}: {_when(fix['offload'])}"
                                    if fix["offload"] else "no CPU instance priced")
                         + " |")
        lines.append("")
    return lines


def _when(row: dict) -> str:
    """Time, $ per job and bottleneck of one projection."""
    return f"{fmt_time(row['seconds'])}, {fmt_usd(row['usd_per_job'])} ({row['bottleneck']})"


def _limit(row: dict) -> str:
    """The bottleneck, and a warning when one epoch does not fit in the page cache."""
    note = row.get("ram_note") or ""
    return row["bottleneck"] + (f"; {note}" if "does not fit" in note else "")


def _recommendation(advice) -> list[str]:
    rec = advice["recommendation"]
    if not rec:
        return []
    ch, fa = rec["cheapest"], rec["fastest"]
    return ["## Recommendation", "",
            f"- **Cheapest**: {ch['option']} on {ch['cloud']} {ch['machine']}: {fmt_time(ch['seconds'])}, "
            f"{fmt_usd(ch['usd_per_job'])} per job on demand ({fmt_usd(ch['usd_per_hour'])}/h). Bound by "
            f"{ch['bottleneck']}.",
            f"- **Fastest**: {fa['option']} on {fa['cloud']} {fa['machine']}: {fmt_time(fa['seconds'])}, "
            f"{fmt_usd(fa['usd_per_job'])} per job. Bound by {fa['bottleneck']}.", ""]


def _method(advice, notes) -> list[str]:
    plan = advice["plan"]
    storage = plan.storage
    lines = ["## How the projections were made", "",
             "- One model for every table (trainfeed.benchmarks.model.projection): each resource sustains a rate of its own — "
             "the device (GPUs x batch / step time; on a CPU node the step's CPU-seconds over the vCPUs, shared with "
             "the reader), the reader's CPU (CPU-seconds per sample measured here as process CPU time, over "
             "min(reader threads, vCPUs)), the storage (requests in flight x bytes per request / request time), the "
             "network, and the vCPUs as a whole, shared by the storage client's I/O CPU (bytes x CPU-seconds per GB), "
             "decode and the framework. With prefetch the job runs at the smallest rate; without, reading and compute "
             "add up.",
             "- Bottlenecks: `compute` (the device, or on a CPU node the step's share of the vCPUs), `decode` (the "
             "reader's CPU; for images the costliest stage: decode, `augment` or read), `io-cpu` (the vCPUs, with the "
             "storage client's CPU their largest consumer), `io-latency` (requests in flight x first-byte latency), "
             "`bandwidth` (streams x per-stream MB/s), `network` (the NIC); a measured cell can also be `contention` "
             "(below the model while the device should set the pace) or `ram` (the node swapped).",
             "- Request concurrency is the loader's own, never scaled with vCPUs: "
             + "; ".join(dict.fromkeys(o.loader.describe() for o in advice["options"])) + ".",
             f"- Storage: {storage.name}: {storage.first_byte_ms:g} ms first byte, {storage.stream_mb_per_s:g} MB/s "
             f"per stream, at most {storage.max_concurrency} in flight ({storage.source}); the client's CPU-s per GB: "
             + ", ".join(f"{v:.2f} at {c}" for c, v in storage.io_cpu_figures.items())
             + f" in flight ({'probed' if storage.io_cpu_s_per_gb else IO_CPU_SOURCE})." if storage else
             "- Storage: local disk as it is (no request cost modelled).",
             "- Step times: \"calibrated\" where `storage-bench calibrate` measured the device, \"measured\" on this "
             "machine, else \"estimate\": training FLOPs / (datasheet peak x efficiency), at least the profile's "
             "per-step floor.",
             "- Prices: benchmarks/model/instances.csv and dbu_rates.csv, each row with its date and source "
             "(`storage-bench prices`); $/h is per instance-hour. Spot: " + Spot().source + "; trainfeed checkpoints "
             "on SIGTERM and resumes with --resume, so an interruption costs the restart, not the work.", ""]
    if notes:
        lines += ["Catalog notes:", ""] + [f"- {n}" for n in notes] + [""]
    return lines


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
            lines.append(f"- **Layout effect** (compacted vs small files, both on {place(any_cell)}, both read with "
                         f"{budget(any_cell)}): {figures}. Per node, projected: the gains under the headline.")
        else:
            lines.append("- **Compacted vs small files, mixing location and layout**: the cells were read from "
                         f"different storage or with different connection budgets, so this is not the layout effect "
                         f"alone: {figures}.")
    for loc in locations:
        local, remote = loc["local_disk"]["samples_per_s"], loc["on_storage"]["samples_per_s"]
        if not local or not remote:
            lines.append(f"- **Location effect** ({loc['store']}): too few batches to time (raise --steps or "
                         "use more samples).")
            continue
        lines.append(f"- **Location effect** (the same {loc['store']} store, both read with {budget(loc)}): ingest-only "
                     f"from local disk as it is {local:,.0f} samples/s, from {place(loc)}: {remote:,.0f} samples/s: "
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


def markdown_nothing_measured(records, errors) -> str:
    env = next((r["env"] for r in records if r.get("env")), None)
    machine = f" · machine: {env['cores']} vCPUs, {env['ram_gb']} GB RAM, GPU: {env['gpu'] or 'none'}" if env else ""
    lines = ["# Storage A/B report", "",
             f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC{machine}", "",
             f"**No cell was measured**: all {len(errors)} failed, so there is nothing to compare or project. "
             "Each failure and its reason:", ""]
    return "\n".join(lines + _failures_section(errors))
