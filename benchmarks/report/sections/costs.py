"""The cost sections: the few cost rows that matter, the remedies for a preprocessing
bottleneck, and the whole catalog (``catalog_markdown``, which report.html folds away)."""
from __future__ import annotations

from trainfeed.benchmarks.model.advice import Advice
from trainfeed.benchmarks.records import ProjectionRow
from trainfeed.benchmarks.report.formatting import fmt_num, fmt_rate, fmt_time, fmt_usd

#: The footnote of every cost row whose dataset does not fit in its instance's page cache.
RAM_FOOTNOTE = ("[ram] the dataset does not fit in 80% of the instance's RAM: epochs after the first read the storage "
                "again, not the page cache (the full note per instance: costs.csv)")


def _pick_costs(advice: Advice, my_instance: str | None = None) -> list[tuple[str, ProjectionRow]]:
    """The few cost rows that matter, each with why it is listed: the fastest and the cheapest
    of all, the best per dollar on each kind of node (a GPU model, or CPU only), the
    scenario's own instances or ``my_instance`` (`--my-instance`: its cheapest option), and the
    small files on the cheapest instance (what today costs)."""
    rows = [r for rs in advice.projections.values() for r in rs]
    if not rows:
        return []
    picked: dict[int, tuple[str, ProjectionRow]] = {}

    def pick(row: ProjectionRow | None, why: str) -> None:
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


def costs_section(advice: Advice, my_instance: str | None = None) -> list[str]:
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
        gpus, vcpus = _machine(r)
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


def _machine(r: ProjectionRow) -> tuple[str, str]:
    """An instance's GPUs and vCPUs as the tables show them (the vCPUs the job needs, when more)."""
    gpus = f"{r['gpus']} {r['device']}" if r["gpus"] else "-"
    needs = f" (needs {r['vcpus_needed']})" if (r.get("vcpus_needed") or 0) > r["vcpus"] else ""
    return gpus, f"{r['vcpus']}{needs}"


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
            gpus, vcpus = _machine(r)
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


def remedies_section(advice: Advice) -> list[str]:
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


def _when(row: ProjectionRow) -> str:
    """Time, $ per job and bottleneck of one projection."""
    return f"{fmt_time(row['seconds'])}, {fmt_usd(row['usd_per_job'])} ({row['bottleneck']})"


def _limit(row: ProjectionRow) -> tuple[str, bool]:
    """The bottleneck, marked [ram] when one epoch does not fit in the page cache (the footnote
    says what that means), and whether it is so."""
    short = "does not fit" in (row.get("ram_note") or "")
    return row["bottleneck"] + (" [ram]" if short else ""), short
