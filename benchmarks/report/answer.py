"""The report's first screen: what to do, its time and cost per job, what binds, what is faster
(only beyond the measurement's noise: ``model.noise``), what repacking gains and how sure the
answer is."""
from __future__ import annotations

from trainfeed.benchmarks.model.advice import Advice, Gains
from trainfeed.benchmarks.model.noise import level, within
from trainfeed.benchmarks.model.verdict import doubts, too_short
from trainfeed.benchmarks.records import CellKey, ProjectionRow, Record
from trainfeed.benchmarks.report.formatting import fmt_ratio, fmt_time, fmt_usd

#: What each bottleneck means for the user, in one sentence: what sets the pace and what helps.
BINDS = {
    "compute": "the accelerator sets the pace: a faster or a second GPU helps, a faster reader does not",
    "decode": "the reader's CPU (decoding) sets the pace: more vCPUs with more reader threads (--workers), or "
              "storing decoded pixels, help",
    "augment": "the CPU spent on augmentation sets the pace: more vCPUs, or augmenting on the GPU, help",
    "io-cpu": "the vCPUs the storage client spends on I/O set the pace: more vCPUs per GPU help",
    "io-latency": "request latency sets the pace: more requests in flight (--io-concurrency) or fewer, larger "
                  "reads (a compacted store) help",
    "bandwidth": "storage bandwidth sets the pace: more parallel streams or faster storage help",
    "network": "the instance's network sets the pace: an instance with more network bandwidth helps",
    "contention": "other processes took the CPU the pipeline needed: rerun on an idle machine",
    "ram": "the node swapped: an instance with more RAM helps",
}

#: A projected gain under this ratio is "about the same", not a speed-up worth stating.
GAIN_WORTH_SAYING = 1.15


def worth_saying(gain: Gains) -> bool:
    """Whether repacking's gain is one to state: at least 15%, and beyond the noise."""
    return gain.repack_gain >= GAIN_WORTH_SAYING and not gain.repack_level


def binds(bottleneck: str, advice: Advice) -> str:
    """What sets the pace and what helps; never a faster GPU where the headline shows every GPU
    giving the same time."""
    if bottleneck == "compute" and same_gpu_rows(advice):
        return ("the accelerator's per-step floor sets the pace: every GPU of the headline gives the same time, so a "
                "faster GPU does not help; a larger batch does")
    return BINDS.get(bottleneck, f"{bottleneck} sets the pace")


def same_gpu_rows(advice: Advice) -> list[str]:
    """The GPU nodes of the headline whose every option projects to the same time (2 or more), or []."""
    gpus = [h for h in advice.headline if h.machine.device.is_gpu and h.rows]
    times = {h.node: tuple(round(r["seconds"], 6) for r in h.rows) for h in gpus}
    if len(times) < 2 or len(set(times.values())) != 1:
        return []
    return list(times)


def answer(advice: Advice, cells: dict[CellKey, Record], locations: list[Record], contended: list[Record]) -> list[str]:
    """The first screen: what to do, its time and cost per job, how sure, what binds."""
    w = advice.plan.workload
    rec = advice.recommendation
    lines = ["## What to do", ""]
    row: ProjectionRow | None
    if rec:
        ch = rec.cheapest
        spot = f"; spot {fmt_usd(ch['spot_usd_per_job'])}" if ch.get("spot_usd_per_job") else ""
        lines.append(f"**Use {ch['option']} on {ch['cloud']} {ch['machine']}**: {fmt_time(ch['seconds'])} and "
                     f"{fmt_usd(ch['usd_per_job'])} per job on demand ({fmt_usd(ch['usd_per_hour'])}/h{spot}) for "
                     f"{w.samples:,} samples x {w.epochs} epoch{'s' if w.epochs != 1 else ''}, "
                     "the cheapest of the catalog.")
        lines.append("")
        row = ch
        lines.append(f"- **What binds**: {ch['bottleneck']}: {binds(ch['bottleneck'], advice)}.")
        if rec.fastest is not ch:
            lines.append(fastest_instead(advice, ch, rec.fastest))
    else:
        fastest = [r for h in advice.headline for r in h.rows if r.get("fastest")]
        row = fastest[0] if fastest else None
        if row is None:
            return [*lines, "Nothing could be projected: see the failures below.", ""]
        lines.append(f"**Use {row['option']}**: {fmt_time(row['seconds'])} per job on {row['machine']} for "
                     f"{w.samples:,} samples x {w.epochs} epoch{'s' if w.epochs != 1 else ''} "
                     "(no priced instance in the catalog, so no cost).")
        lines.append("")
        lines.append(f"- **What binds**: {row['bottleneck']}: {binds(row['bottleneck'], advice)}.")
    for g in filter(None, advice.gains):
        if worth_saying(g):
            lines.append(f"- **Repacking** on {g.node}: {g.repacked} is {fmt_ratio(g.repack_gain)} faster "
                         f"than {g.today} ({fmt_time(g.repacked_s)} vs {fmt_time(g.today_s)}).")
            break
    level, why = confidence(advice, cells, locations, contended, row)
    lines.append(f"- **How sure**: {level}: {'; '.join(why)}.")
    return [*lines, ""]


def fastest_instead(advice: Advice, cheapest: ProjectionRow, fastest: ProjectionRow) -> str:
    """The fastest option of the catalog beside the cheapest, said faster only beyond the noise.
    On the fastest instance, the options level with the fastest are named with it, and the
    cheapest's own option is the one shown where it is among them: a store is not "the fastest"
    by a margin the measurement cannot tell from zero."""
    if level(cheapest, fastest):
        return (f"- **Fastest instead**: none beyond the noise: {fastest['option']} on {fastest['cloud']} "
                f"{fastest['machine']} projects {fmt_time(fastest['seconds'])}, level with this "
                f"({within(cheapest, fastest)}).")
    there = [r for rows in advice.projections.values() for r in rows
             if (r["cloud"], r["machine"]) == (fastest["cloud"], fastest["machine"]) and level(r, fastest)
             and not level(r, cheapest)]
    shown = next((r for r in there if r["option"] == cheapest["option"]), fastest)
    others = [r for r in there if r is not shown]
    tied = (f"; {', '.join(r['option'] for r in others)} level with it there "
            f"({within(shown, max(others, key=lambda r: r['spread'] or 0))})" if others else "")
    return (f"- **Fastest instead**: {shown['option']} on {shown['cloud']} {shown['machine']}: "
            f"{fmt_time(shown['seconds'])}, {fmt_usd(shown['usd_per_job'])} per job "
            f"({fmt_ratio(cheapest['seconds'] / shown['seconds'])} faster, "
            f"{fmt_ratio(shown['usd_per_job'] / cheapest['usd_per_job'])} the cost); bound by "
            f"{shown['bottleneck']}{tied}.")


def confidence(advice: Advice, cells: dict[CellKey, Record], locations: list[Record], contended: list[Record],
               row: ProjectionRow | None) -> tuple[str, list[str]]:
    """How sure the answer is (high, medium, low) and why: cells measured under contention, too
    short or contradicting the model lower it to low; a GPU step time that is an estimate, not a
    measurement, to medium."""
    low = []
    if contended:
        low.append(f"{len(contended)} of {len(cells)} cells were measured under contention")
    doubtful = [c for c in cells.values() if doubts(c)]
    if doubtful:
        low.append(f"{len(doubtful)} of {len(cells)} cells are too short to mean anything or contradict the model "
                   "(their notes say which)")
    for loc in locations:
        if location_doubt(loc):
            low.append(f"the location effect ({loc['store']}) could not be measured reliably")
    medium = []
    if row is not None and row.get("device_how") == "estimate" and row.get("gpus"):
        medium.append(f"the {row['device']} step time is an estimate from FLOPs (`storage-bench calibrate` on the "
                      "real GPU measures it)")
    if low:
        return "low", low + medium
    if medium:
        return "medium", medium
    return "high", ["every input was measured on this machine or calibrated, and no cell is in doubt"]


def location_doubt(loc: Record) -> str | None:
    """Why a location-effect measurement cannot be taken as one: either read too short to mean
    anything, or reading through emulated latency beat local disk, which the model's physics
    rule out (the emulation only adds time)."""
    for where, rec in (("from local disk", loc.get("local_disk")), ("from the storage", loc.get("on_storage"))):
        short = too_short(rec)
        if short:
            return f"the read {where} was {short}"
    local, remote = loc["local_disk"]["samples_per_s"], loc["on_storage"]["samples_per_s"]
    if remote > local:
        return (f"reading through the emulated latency ({remote:,.0f} samples/s) beat local disk ({local:,.0f}), "
                "which the emulation cannot do (it only adds time): noise of a measurement this short or a busy "
                "machine; rerun with more --steps or samples")
    return None
