"""The reference case of a scenario run: its published times beside this run's projections,
the speed-ups, and which knob decides each figure that is off."""
from __future__ import annotations

from trainfeed.benchmarks.model.advice import Advice
from trainfeed.benchmarks.report.formatting import fmt_num, fmt_ratio, fmt_time, fmt_usd


def _deviation(d: float | None) -> str:
    return "-" if d is None else f"{d:+.0%}"


def reference_section(advice: Advice) -> list[str]:
    """The scenario's published times and speed-ups beside the projections, and the knobs' sources."""
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
