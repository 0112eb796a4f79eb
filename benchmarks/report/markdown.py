"""report.md: the Markdown of a report, section by section: first the answer (answer.py: what to
do, its time and cost, how sure, what binds) and the headline, then the reference case, feeds,
effects, cells, the costs that matter, remedies, method, failures; or of a run that measured nothing.
``catalog_markdown`` is every catalog row, which the HTML page folds away."""
from __future__ import annotations

import re
from datetime import datetime, timezone

from trainfeed.benchmarks.model.advice import Advice
from trainfeed.benchmarks.model.cost import Spot
from trainfeed.benchmarks.model.measured import layout_of, loader_of, machine_of, storage_of
from trainfeed.benchmarks.model.noise import level, rule
from trainfeed.benchmarks.model.profiles import IO_CPU_SOURCE
from trainfeed.benchmarks.model.projection import project
from trainfeed.benchmarks.model.verdict import doubts, too_short
from trainfeed.benchmarks.report.answer import GAIN_WORTH_SAYING, answer, location_doubt, same_gpu_rows, worth_saying
from trainfeed.benchmarks.report.formatting import budget, fmt_num, fmt_rate, fmt_ratio, fmt_time, fmt_usd, place
from trainfeed.converters.redact import redact


def _storage_key(cell) -> tuple:
    """Where a cell read from and with which connection budget: cells compared for the layout
    effect must share it."""
    return cell["storage"]["backend"], cell["storage"]["profile"], tuple(sorted(cell["connections"].items()))


def markdown(cells, spread, locations, stores, nodes, frameworks, advice: Advice, notes, errors,
             my_instance: str | None = None) -> str:
    any_cell = next(iter(cells.values()))
    env = any_cell["env"]
    plan = advice.plan
    same_storage = len({_storage_key(c) for c in cells.values()}) == 1
    lines = ["# Storage A/B report", "",
             f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC · machine: {env['cores']} vCPUs, "
             f"{env['ram_gb']} GB RAM, GPU: {env['gpu'] or 'none'} · samples "
             f"{'x'.join(map(str, any_cell['sample_shape']))} "
             f"({any_cell['sample_bytes'] / 1e3:.0f} KB) · batch {any_cell['batch_size']} · model ResNet-18 width "
             f"{any_cell['width']} · every store read from: "
             + (f"{place(any_cell)}; {budget(any_cell)}" if same_storage
                else "different storage or budgets (see each cell)"),
             ""]
    contended = [c for c in cells.values() if any("contention" in n for n in c.get("checks", []))]
    lines += answer(advice, cells, locations, contended)
    lines += _headline(advice)
    if contended:
        lines += [f"> **Measured under contention**: {len(contended)} of {len(cells)} cells ran while other processes "
                  "or the hypervisor took CPU (see each cell's notes). Wall-clock rates of those cells are low and "
                  "noisy; the projections use CPU time per sample, which contention distorts far less. Rerun on an "
                  "idle machine to confirm.", ""]
    if plan.scenario is not None:
        lines += _reference_section(advice)
    lines += _feeds_section(advice)
    lines += _effects(cells, locations, same_storage)
    lines += _cells_section(cells, spread, nodes, stores)
    lines += _costs_section(advice, my_instance)
    lines += _remedies_section(advice)
    lines += _method(advice, notes)
    lines += _failures_section(errors)
    return "\n".join(lines) + "\n"


def _deviation(d: float | None) -> str:
    return "-" if d is None else f"{d:+.0%}"


def _reference_section(advice: Advice) -> list[str]:
    ref, sc = advice.reference, advice.plan.scenario
    assert ref is not None and sc is not None, "only a scenario's report has a reference case"
    lines = [f"## Reference case: {sc.name}", "",
             f"Scenario `{sc.path}`. Published times beside this run's projections for the same workload "
             f"({sc.workload.total:,} samples, batch {sc.batch_size}); "
             "the model is the one every table below uses.", "",
             "| node | store, loader | projected | published | deviation | bottleneck | $/h | $ projected | "
             "$ at the published time |", "|---|---|---|---|---|---|---|---|---|"]
    for r in ref.rows:
        lines.append(f"| {r['node']} | {r['store']}, {sc.loader_for(r['store']).name} | {fmt_time(r['projected_s'])} | "
                     f"{fmt_time(r['reference_s'])} | {_deviation(r['deviation'])} | {r['bottleneck'] or '-'} | "
                     f"{fmt_usd(r['usd_per_hour'])} | {fmt_usd(r['projected_usd'])} | {fmt_usd(r['reference_usd'])} |")
    lines += ["", "| node | speed-up published | projected | deviation |", "|---|---|---|---|"]
    for s in ref.speedups:
        lines.append(f"| {s.node} | {fmt_ratio(s.published)} | {fmt_ratio(s.projected)} | "
                     f"{_deviation(s.deviation)} |")
    verdict = ("every figure within 25% of the paper" if ref.within_25pct else
               "not every figure is within 25% of the paper: see below which knob decides each")
    lines += ["", f"**{verdict}.**", ""]
    for x in ref.cross_checks:
        what = "CPU-seconds per step" if x.device == "cpu" else "seconds per step"
        lines.append(f"- **{x.node}**: its compacted run is compute-bound, so its published time implies the "
                     f"device: {fmt_num(x.implied_step_s, 3)} {what} where this projection used "
                     f"{fmt_num(x.step_s, 3)} "
                     f"({x.device}, {x.device_how}), {fmt_ratio(x.slower)} slower. With that device the small "
                     f"files project to {fmt_time(x.blob_projected_s)} against {fmt_time(x.blob_reference_s)} "
                     f"published ({_deviation(x.blob_deviation)}): the storage and loader side of the model holds; "
                     "the device's speed is the knob (`storage-bench calibrate` on the real node measures it).")
    lines += ["", "Knobs and their sources:", ""]
    lines += [f"- {k}: {v}" for k, v in ref.sources.items()]
    lines += ["- accelerator step time: " + "; ".join(sorted({f"{r['device']} {r['device_how']}"
                                                          for h in advice.headline for r in h.rows})), ""]
    return lines


def _headline(advice: Advice) -> list[str]:
    plan = advice.plan
    w = plan.workload
    lines = [f"## Training time for {w.samples:,} samples x {w.epochs} epoch{'s' if w.epochs != 1 else ''}", "",
             "Projected by one model from the quantities measured here (see \"How the projections were made\"); "
             "the bottleneck is the resource that binds. The fastest option on each node is in bold, and so is every "
             f"option level with it: {rule([r for h in advice.headline for r in h.rows])}.", ""]
    opts = [o.label for o in advice.options]
    lines += ["| node | " + " | ".join(opts) + " |", "|---|" + "---|" * len(opts)]
    for h in advice.headline:
        rows = {r["option"]: r for r in h.rows}
        best = min(h.rows, key=lambda r: r["seconds"], default=None)
        cells = []
        for o in opts:
            r = rows.get(o)
            text = f"{fmt_time(r['seconds'])} ({fmt_rate(r['samples_per_s'])}/s, {r['bottleneck']})" if r else "-"
            cells.append(f"**{text}**" if r and best and level(r, best) else text)
        label = (f"{h.node} ({h.instance})" if h.instance
                 else h.rows[0]["machine"] if h.rows else h.node)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    same = same_gpu_rows(advice)
    if same:
        bound = sorted({r["bottleneck"] for h in advice.headline if h.node in same for r in h.rows})
        why = ("each step lasts the profile's per-step floor (an estimate at this small a model and batch)"
               if bound == ["compute"] else
               f"every option is bound by the same thing on each ({', '.join(bound)}), and a compute-bound step "
               "lasts the profile's per-step floor" if "compute" in bound else
               f"every option is bound outside the GPU ({', '.join(bound)})")
        lines.append(f"- **{', '.join(same)}**: the same time on every GPU: {why}; so a faster GPU does not help "
                     "here (a larger batch, or `storage-bench calibrate` on the real GPU, says more).")
    little = []
    said: dict[str, list[str]] = {}  # the same finding on several nodes is written once, naming them all
    for g in filter(None, advice.gains):
        if not worth_saying(g) and not g.better_loading:
            little.append(g.node)  # said once for all such nodes, below
            continue
        if worth_saying(g):
            text = (f"repacking ({g.repacked}) is **{fmt_ratio(g.repack_gain)}** faster than "
                    f"{g.today} ({fmt_time(g.repacked_s)} vs {fmt_time(g.today_s)})")
        else:
            text = (f"repacking ({g.repacked}) changes little ({fmt_time(g.repacked_s)} vs "
                    f"{fmt_time(g.today_s)} for {g.today}): the layout is not what binds there")
        if g.better_loading:
            text += f"; better loading alone ({g.better_loading}) would be {fmt_ratio(g.better_loading_gain)}"
        said.setdefault(text, []).append(g.node)
    lines += [f"- **{', '.join(nodes)}**: {text}." for text, nodes in said.items()]
    if little:
        lines.append(f"- **{', '.join(little)}**: repacking changes little (under "
                     f"{fmt_num((GAIN_WORTH_SAYING - 1) * 100)}%, or within the noise): the layout is not what binds "
                     "there.")
    return lines + [""]


def _feeds_section(advice: Advice) -> list[str]:
    """Per GPU: the GB/s it reads at its own rate and the vCPUs busy feeding it (model.feed)."""
    if not advice.feeds:
        return []
    storage = advice.plan.storage
    where = storage.name if storage else "local disk"
    io = (f"the storage client's I/O CPU (GB/s x CPU-s per GB at the loader's requests in flight: "
          f"{storage.io_cpu_source})" if storage else
          "no I/O CPU apart (local reads are in the reader's measured CPU)")
    opts = [o.label for o in advice.options]
    lines = [f"## vCPUs to feed one GPU from {where}", "",
             f"One GPU at its own rate (samples/s from its step time) reading each option from {where}: the GB/s it "
             f"takes and the vCPUs busy for it: {io}, decode (the reader's CPU per sample, measured here) and the "
             "framework's host work (measured on a real GPU; 0 for an emulated or estimated one, whose step sleeps). "
             "The model's `io-cpu`, `decode` and remedies use the same figures. They hold for a PyTorch DataLoader "
             "whose workers read through trainfeed's TorchDataset: the workers hand batches over in shared memory, "
             "at 0.9-1.35x the CPU per GB of trainfeed's own threads (docs/BENCHMARKS.md).", "",
             "| GPU | " + " | ".join(opts) + " |", "|---|" + "---|" * len(opts)]
    rows: dict[tuple, list[str]] = {}  # GPUs with the same figures (at the per-step floor, say) share a row
    for row in advice.feeds:
        d = row.device
        first = next(iter(row.feeds.values()))
        cells = []
        for o in opts:
            f = row.feeds[o]
            per_gb = f" at {f.io_cpu_s_per_gb:.2f} CPU-s/GB" if storage else ""
            cells.append(f"{fmt_num(f.gb_per_s)} GB/s{per_gb}: {f.describe()}")
        rows.setdefault((d.how, fmt_rate(first.samples_per_s), *cells), []).append(d.name)
    for (how, rate, *cells), names in rows.items():
        lines.append(f"| {', '.join(names)} ({how}, {rate} samples/s) | " + " | ".join(cells) + " |")
    return lines + [""]


def _general(note: str) -> tuple[str, str]:
    """A cell's note as (what it means, this cell's figures): "real run measured under contention
    (other processes used 53% ...): wall rates ..." is the footnote "real run measured under
    contention: wall rates ..." and the figures "(other processes used 53% ...)" stay in the cell,
    so a note that differs only by its figures is written once."""
    figures = re.findall(r" \(([^()]*\d[^()]*)\)", note)
    return re.sub(r" \([^()]*\d[^()]*\)", "", note), f"({'; '.join(figures)})" if figures else ""


def _cells_section(cells, spread, nodes, stores) -> list[str]:
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


#: An ingest-only pass that read only its warm-up batch has no rate (verdict.too_short says why).
NOT_TIMED = "not timed (too few batches)"

#: The footnote of every cost row whose dataset does not fit in its instance's page cache.
RAM_FOOTNOTE = ("[ram] the dataset does not fit in 80% of the instance's RAM: epochs after the first read the storage "
                "again, not the page cache (the full note per instance: costs.csv)")


def _pick_costs(advice: Advice, my_instance: str | None = None) -> list[tuple[str, dict]]:
    """The few cost rows that matter, each with why it is listed: the fastest and the cheapest
    of all, the best per dollar on each kind of node (a GPU model, or CPU only), the
    scenario's own instances or ``my_instance`` (`--my-instance`: its cheapest option), and the
    small files on the cheapest instance (what today costs)."""
    rows = [r for rs in advice.projections.values() for r in rs]
    if not rows:
        return []
    picked: dict[int, tuple[str, dict]] = {}

    def pick(row: dict | None, why: str) -> None:
        if row is not None:
            key = id(row)
            picked[key] = (picked[key][0] + "; " + why, row) if key in picked else (why, row)

    priced = [r for r in rows if r.get("usd_per_job")]
    pick(min(rows, key=lambda r: r["seconds"]), "fastest")
    if priced:
        cheapest = min(priced, key=lambda r: r["usd_per_job"])
        pick(cheapest, "cheapest")
        kinds = dict.fromkeys(r["device"] if r["gpus"] else "CPU only" for r in priced)
        for kind in kinds:
            mine = [r for r in priced if (r["device"] if r["gpus"] else "CPU only") == kind]
            pick(min(mine, key=lambda r: r["usd_per_job"]), f"best per $ on {kind}")
        today = [r for r in priced if r["store"] == "blob" and r["machine"] == cheapest["machine"]]
        if cheapest["store"] != "blob" and today:
            pick(min(today, key=lambda r: r["usd_per_job"]), "the small files on the cheapest instance")
    if my_instance:
        mine = [r for r in rows if r["machine"] == my_instance]
        if mine:
            pick(min(mine, key=lambda r: (r["usd_per_job"] is None, r["usd_per_job"] or 0, r["seconds"])),
                 "your instance")
    sc = advice.plan.scenario
    if sc is not None:
        for n in sc.nodes:
            mine = [r for r in rows if r["machine"] == n.instance]
            if mine:
                pick(min(mine, key=lambda r: r["seconds"]), f"your node {n.name}")
    return sorted(picked.values(), key=lambda wr: (wr[1]["usd_per_job"] is None, wr[1]["usd_per_job"] or 0,
                                                     wr[1]["seconds"]))


def _costs_section(advice: Advice, my_instance: str | None = None) -> list[str]:
    """Only the rows that matter (``_pick_costs``); the whole catalog is in costs.csv and, folded,
    in report.html."""
    picked = _pick_costs(advice, my_instance)
    if not picked:
        return []
    total = sum(len(rs) for rs in advice.projections.values())
    lines = ["## What it costs", "",
             f"The options that matter, of {total:,} projected (every store on every instance of the catalog: "
             "costs.csv, and folded below in report.html). $/h is the instance's price per hour (plus Databricks "
             "DBUs where the catalog has them); per job is the whole workload; spot per job includes restarts after "
             "preemption.", "",
             "| why listed | store | instance | vCPUs | GPUs | samples/s | time | $/h | $ per job | spot $ per job | "
             "bottleneck | price date |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ram = False
    for why, r in picked:
        gpus = f"{r['gpus']} {r['device']}" if r["gpus"] else "-"
        vcpus = f"{r['vcpus']}" + (f" (needs {r['vcpus_needed']})" if (r.get("vcpus_needed") or 0) > r["vcpus"] else "")
        limit, short = _limit(r)
        ram = ram or short
        lines.append(f"| {why} | {r['option']} | {r['cloud']} {r['machine']} | {vcpus} | {gpus} | "
                     f"{fmt_rate(r['samples_per_s'])} | {fmt_time(r['seconds'])} | {fmt_usd(r['usd_per_hour'])} | "
                     f"{fmt_usd(r['usd_per_job'])} | {fmt_usd(r['spot_usd_per_job'])} | {limit} | "
                     f"{r.get('price_date') or '-'} |")
    lines.append("")
    if ram:
        lines += [RAM_FOOTNOTE, ""]
    return lines


def catalog_markdown(advice: Advice) -> str:
    """Every projected catalog row, one table per option: what report.html folds away under the
    costs that matter."""
    lines = []
    ram = False
    for label, rows in advice.projections.items():
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
            vcpus = f"{r['vcpus']}" + (f" (needs {r['vcpus_needed']})" if (r.get("vcpus_needed") or 0) > r["vcpus"]
                                       else "")
            limit, short = _limit(r)
            ram = ram or short
            lines.append(f"| {name} | {vcpus} | {gpus} | {fmt_rate(r['samples_per_s'])} | {fmt_time(r['seconds'])} | "
                         f"{fmt_usd(r['usd_per_hour'])} | {fmt_usd(r['usd_per_job'])} | "
                         f"{fmt_usd(r['spot_usd_per_job'])} | {fmt_usd(r['usd_per_1k_samples'])} | "
                         f"{fmt_num(r['time_vs_fastest'])} | {fmt_num(r['cost_vs_cheapest'])} | {limit} | "
                         f"{r.get('price_date') or '-'} |")
        lines.append("")
    if ram:
        lines += [RAM_FOOTNOTE, ""]
    return "\n".join(lines) + "\n"


def _remedies_section(advice: Advice) -> list[str]:
    """Per GPU instance bound by its vCPUs (decode or I/O CPU): the vCPUs it needs, and three remedies
    with time and cost."""
    if not advice.remedies:
        return []
    lines = ["## The preprocessing bottleneck: remedies", "",
             "Where the instance's vCPUs cannot keep its GPUs busy (decoding encoded images, or the storage client's "
             "I/O CPU): the vCPUs this pipeline needs at the GPUs' rate (I/O, decode and the framework), and three "
             "remedies projected with the same model — an instance with enough "
             "vCPUs per GPU and reader threads (`--workers`) to use them, storing decoded pixels (more bytes, no "
             "decode), and offloading reading and preprocessing to CPU instances running tf.data service workers "
             "(`train --data-service`; TensorFlow's decode costs ~2.7x Pillow's CPU per image, `make "
             "bench-decode`). Times and $ per job (on demand).", ""]
    for store, rows in advice.remedies.items():
        lines += [f"**{store}**", "", "| instance | today | vCPUs / needed | larger CPU:GPU instance | "
                  "decoded pixels | offload to CPU workers |", "|---|---|---|---|---|---|"]
        for fix in rows:
            t = fix.today
            lines.append(f"| {t['cloud']} {t['machine']} | {_when(t)} | {t['vcpus']} / {fix.vcpus_needed} | "
                         + (f"{fix.bigger['machine']} --workers {fix.bigger['workers']}: {_when(fix.bigger)}"
                            if fix.bigger else "none in the catalog")
                         + " | " + (_when(fix.decoded) if fix.decoded
                                    else "not measured (--image-storage decoded)")
                         + " | " + (f"{fix.offload['workers']} x {fix.offload['worker']}: {_when(fix.offload)}"
                                    if fix.offload else "no CPU instance priced")
                         + " |")
        lines.append("")
    return lines


def _when(row: dict) -> str:
    """Time, $ per job and bottleneck of one projection."""
    return f"{fmt_time(row['seconds'])}, {fmt_usd(row['usd_per_job'])} ({row['bottleneck']})"


def _limit(row: dict) -> tuple[str, bool]:
    """The bottleneck, marked [ram] when one epoch does not fit in the page cache (the footnote
    says what that means), and whether it is so."""
    short = "does not fit" in (row.get("ram_note") or "")
    return row["bottleneck"] + (" [ram]" if short else ""), short


def _method(advice: Advice, notes) -> list[str]:
    plan = advice.plan
    storage = plan.storage
    lines = ["## How the projections were made", "",
             "- One model for every table (trainfeed.benchmarks.model.projection): each resource sustains a rate "
             "of its own — "
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
             + "; ".join(dict.fromkeys(o.loader.describe() for o in advice.options)) + ".",
             f"- Storage: {storage.name}: {storage.first_byte_ms:g} ms first byte, {storage.stream_mb_per_s:g} MB/s "
             f"per stream, at most {storage.max_concurrency} in flight ({storage.source}); the client's CPU-s per GB: "
             + ", ".join(f"{v:.2f} at {c}" for c, v in storage.io_cpu_figures.items())
             + f" in flight ({'probed' if storage.io_cpu_s_per_gb else IO_CPU_SOURCE})." if storage else
             "- Storage: local disk as it is (no request cost modelled).",
             "- The reader's CPU per sample (decode, and every vCPU figure): the process CPU time, every thread, of "
             "each store's ingest-only pass, the pass that read the samples; an image store's stages (read, "
             "decode+resize, augment) are one thread's CPU time at staging, which misses the storage client's and the "
             "reader's other threads, and only name the costliest stage.",
             f"- Dataset sizes (whether an epoch fits in an instance's RAM): {plan.workload.samples:,} samples x each "
             "store's bytes per sample without its fixed overhead (metadata, chunk and heap overhead, manifests, a "
             "partly filled last chunk: paid once, not per sample): "
             + "; ".join(f"{s} {fmt_num(lay.dataset_bytes_per_sample / 1e3)} KB, "
                         f"{fmt_num(plan.workload.samples * lay.dataset_bytes_per_sample / 2**30)} GiB"
                         for s, lay in advice.layouts.items()) + ".",
             "- Level: two projections are level, neither called faster, when their times are "
             + rule([r for rows in advice.projections.values() for r in rows]) + ".",
             "- Step times: \"calibrated\" where `storage-bench calibrate` measured the device, \"measured\" on this "
             "machine, else \"estimate\": training FLOPs / (datasheet peak x efficiency), at least the profile's "
             "per-step floor.",
             "- Prices: benchmarks/model/instances.csv and dbu_rates.csv, each row with its date and source "
             "(`storage-bench prices`); $/h is per instance-hour. Spot: " + Spot().source + "; trainfeed checkpoints "
             "on SIGTERM and resumes with --resume, so an interruption costs the restart, not the work.", ""]
    if notes:
        lines += ["Catalog notes:", ""] + [f"- {n}" for n in _grouped_notes(notes)] + [""]
    return lines


def _grouped_notes(notes: list[str]) -> list[str]:
    """Catalog notes, one line per problem: "instances.csv, line 60 (gcp g2-standard-8): no
    on-demand price; ..." for seven rows is one line naming the seven instances."""
    groups: dict[str, list[tuple[str, str]]] = {}
    plain = []
    for n in notes:
        m = re.match(r"^(\S+), line (\d+) \(([^()]+)\): (.+)$", n)
        if m:
            groups.setdefault(f"{m.group(1)}\t{m.group(4)}", []).append((m.group(2), m.group(3)))
        else:
            plain.append(n)
    out = []
    for key, rows in groups.items():
        where, problem = key.split("\t")
        if len(rows) == 1:
            out.append(f"{where}, line {rows[0][0]} ({rows[0][1]}): {problem}")
        else:
            out.append(f"{problem}: {', '.join(r[1] for r in rows)} ({where}, lines {', '.join(r[0] for r in rows)})")
    return out + plain


def _effects(cells, locations, same_storage: bool) -> list[str]:
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
