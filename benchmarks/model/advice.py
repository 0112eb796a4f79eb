"""Everything storage-bench advises, computed once from the recorded cells: the headline (each
measured node), the catalog (each instance), the recommendation and, for a scenario, the
comparison with the published times. All rows come from ``cost.projection_row``; the report
(benchmarks/report/) only renders them."""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypedDict

from trainfeed.benchmarks.model.catalog import DbuRate, Instance
from trainfeed.benchmarks.model.cost import (
    GPU_PROFILES,
    Recommendation,
    Workload,
    cpu_device,
    gpu_device,
    machine_of_instance,
    mark_extremes,
    project_catalog,
    projection_row,
    recommend,
    repeat_layouts,
    store_layout,
)
from trainfeed.benchmarks.model.measured import device_of, loader_of, storage_of
from trainfeed.benchmarks.model.noise import level
from trainfeed.benchmarks.model.profiles import Accelerator, ObjectStore
from trainfeed.benchmarks.model.projection import Device, Feed, Layout, Loader, Machine, feed
from trainfeed.benchmarks.model.remedies import Remedy, remedies
from trainfeed.benchmarks.model.scenario import Scenario, ScenarioNode
from trainfeed.benchmarks.records import ProjectionRow, Record


@dataclass(frozen=True)
class Option:
    """One way to read the data: a store read by a loader ("blob" by your loader, "blob" by
    trainfeed's reader, "delta" by trainfeed's reader, ...)."""

    label: str
    store: str
    loader: Loader


@dataclass(frozen=True)
class Plan:
    """What the projections are for: the workload, the storage they read from, the loaders."""

    workload: Workload
    storage: ObjectStore | None
    reader: Loader  # how the compacted stores are read (and the small files, by trainfeed)
    baseline: Loader | None = None  # how the user reads the small files today
    scenario: Scenario | None = None


@dataclass(frozen=True, slots=True)
class HeadlineNode:
    """One node of the headline: the machine it is projected as and one projection row per option;
    for a scenario's node, its catalog instance and ``project``, the same rows on another machine."""

    node: str
    machine: Machine
    rows: list[ProjectionRow]
    instance: str | None = None
    project: Callable[[Machine], list[ProjectionRow]] | None = None


@dataclass(frozen=True, slots=True)
class DeviceFeeds:
    """One GPU fed at its own rate: what each option takes (``model.feed``), by option label."""

    device: Device
    feeds: dict[str, Feed]


@dataclass(frozen=True, slots=True)
class Gains:
    """On one node: what repacking gains over the user's loader (``today``), and what better loading
    alone (trainfeed's reader on the same small files) would gain; options by label, times in seconds."""

    node: str
    today: str
    today_s: float
    repacked: str
    repacked_s: float
    repack_gain: float
    repack_level: bool  # the two times are within the noise (noise.level): no gain to state
    better_loading: str | None
    better_loading_gain: float | None


@dataclass(frozen=True, slots=True)
class Advice:
    """Everything a report advises (``build_advice``): the plan and its options, the headline (each
    measured node, or the scenario's), every option projected on the catalog (label -> rows, as
    costs.csv holds them), the feeds per GPU, the remedies per encoded store, the recommendation,
    the gains per headline node, for a scenario the comparison with its published times, and
    each store's layout as projected."""

    plan: Plan
    options: list[Option]
    headline: list[HeadlineNode]
    projections: dict[str, list[ProjectionRow]]
    feeds: list[DeviceFeeds]
    remedies: dict[str, list[Remedy]]
    recommendation: Recommendation | None
    gains: list[Gains | None]
    reference: Reference | None
    layouts: dict[str, Layout]


def plan_for(cells: list[Record], workload: Workload, baseline: Loader | None = None,
             scenario: Scenario | None = None) -> Plan:
    """The plan of a report: the scenario's storage and loaders, else the cells' own (the
    latency profile they were measured through, trainfeed's reader as configured)."""
    ref = next(c for c in cells if c["kind"] == "cell")
    if scenario is not None:
        return Plan(scenario.workload, scenario.storage, scenario.loaders["compacted"], scenario.loaders["blob"],
                    scenario)
    return Plan(workload, storage_of(ref), loader_of(ref), baseline)


def options(plan: Plan, stores: list[str]) -> list[Option]:
    """The ways to read the data that every table compares: the small files by your loader (when
    described) and by the reader, each compacted store by the reader."""
    out = []
    for s in stores:
        if s == "blob" and plan.baseline is not None:
            out.append(Option(f"blob, {plan.baseline.name}", s, plan.baseline))
        out.append(Option(s if s != "blob" else f"blob, {plan.reader.name}", s, plan.reader))
    return out


def calibrated(cells: list[Record]) -> dict[str, Accelerator]:
    """Accelerator profiles measured by `calibrate` that cells ran with, by name: they replace the
    estimate in every catalog row of that GPU."""
    found = {}
    for c in cells:
        acc = c.get("accelerator")
        if c["kind"] == "cell" and acc and acc.get("kind") == "calibrated":
            found[acc["name"]] = Accelerator(**acc)
    return found


def node_machine(cells: list[Record], node: str) -> Machine | None:
    """A measured node as the model sees it: this machine's vCPUs and the node's device."""
    mine = [c for c in cells if c["kind"] == "cell" and c["node"] == node]
    if not mine:
        return None
    cores = mine[0]["env"]["cores"]
    if node == "cpu":
        device = cpu_device(cells)
        assert device is not None, "mine holds this machine's CPU cells"
    else:
        devices = [device_of(c) for c in mine]
        device = Device(node, 1, statistics.median(d.step_s for d in devices), devices[0].how,
                        statistics.median(d.host_cpu_s for d in devices))
    name = (f"cpu: this machine ({cores} vCPUs)" if node == "cpu"
            else f"{node} ({device.how}) on this machine ({cores} vCPUs)")
    return Machine(name, cores, device)


def build_advice(cells: list[Record], catalog: list[Instance], dbu: dict[str, DbuRate], plan: Plan,
                 stores: list[str]) -> Advice:
    accelerators = calibrated(cells)
    layouts = {s: layout for s in stores if (layout := store_layout(cells, s)) is not None}
    repeats = {s: repeat_layouts(cells, s) for s in layouts}
    opts = [o for o in options(plan, stores) if o.store in layouts]
    batch = next(c for c in cells if c["kind"] == "cell")["batch_size"]
    accs = _with_efficiency(accelerators, plan.scenario)
    headline: list[HeadlineNode] = []
    if plan.scenario is None:
        for node in dict.fromkeys(c["node"] for c in cells if c["kind"] == "cell"):
            machine = node_machine(cells, node)
            measured = {c["store"] for c in cells if c["kind"] == "cell" and c["node"] == node}
            if machine is not None:  # a store whose cell on this node failed is not projected onto it
                headline.append(HeadlineNode(node, machine, [
                    projection_row(machine, layouts[o.store], o.loader, plan.storage, batch, plan.workload,
                                   repeats=repeats[o.store])
                    | {"option": o.label} for o in opts if o.store in measured]))
    else:
        by_name = {i.name: i for i in catalog}
        for n in plan.scenario.nodes:
            inst = by_name.get(n.instance)
            if inst is None:
                continue
            machine = machine_of_instance(inst, cells, accs, n.cpu_speed)
            if machine is not None:
                def rows(m: Machine, inst: Instance = inst, n: ScenarioNode = n) -> list[ProjectionRow]:
                    return [projection_row(m, layouts[o.store], o.loader, plan.storage, batch,
                                           plan.workload, inst, cpu_speed=n.cpu_speed, dbu=dbu.get(inst.cloud),
                                           repeats=repeats[o.store])
                            | {"option": o.label} for o in opts]
                headline.append(HeadlineNode(n.name, machine, rows(machine), instance=inst.name, project=rows))
    for h in headline:
        mark_extremes(h.rows)
    speeds = {n.instance: n.cpu_speed for n in plan.scenario.nodes} if plan.scenario else None
    projections = {o.label: project_catalog(cells, catalog, o.store, o.loader, plan.storage, plan.workload,
                                            accelerators=accs, cpu_speeds=speeds, dbu=dbu) for o in opts}
    for label, table in projections.items():
        for r in table:
            r["option"] = label
    by_store = {o.store: projections[o.label] for o in opts if o.loader == plan.reader}
    encoded = [s for s in stores if any(c["kind"] == "cell" and c["store"] == s and c.get("image_storage") == "encoded"
                                        for c in cells)]
    decoded = next((s for s in stores if s.endswith("-decoded")), None)
    fixes = {s: remedies(cells, catalog, s, s.replace("-encoded", "-decoded") if s.endswith("-encoded") else decoded,
                         plan.reader, plan.storage, plan.workload, by_store, accelerators=accs, dbu=dbu)
             for s in encoded}
    return Advice(plan=plan, options=opts, headline=headline, projections=projections,
                  feeds=feeds(cells, catalog, plan, opts, headline, accs),
                  remedies={s: r for s, r in fixes.items() if r},
                  recommendation=recommend(projections),
                  gains=[gains(h, plan) for h in headline],
                  reference=reference(headline, plan) if plan.scenario else None,
                  layouts=layouts)


def feeds(cells: list[Record], catalog: list[Instance], plan: Plan, opts: list[Option], headline: list[HeadlineNode],
          accelerators: dict[str, Accelerator]) -> list[DeviceFeeds]:
    """Per GPU (the headline's, then each GPU of the catalog that has a profile): what feeding one
    of it at its own rate from the plan's storage takes with each option: GB/s, and the vCPUs
    busy for it (the storage client's I/O, decode, the framework)."""
    if not opts:
        return []
    ref = next(c for c in cells if c["kind"] == "cell")
    devices: dict[str, Device] = {}
    for h in headline:
        if h.machine.device.is_gpu:
            devices.setdefault(h.machine.device.name, h.machine.device)
    models = dict.fromkeys(i.gpu_model for i in catalog if i.gpus and i.gpu_model in GPU_PROFILES)
    gpus = [gpu for m in models if (gpu := gpu_device(m, 1, ref, accelerators)) is not None]  # all: each has a profile
    for gpu in sorted(gpus, key=lambda d: -d.step_s):
        devices.setdefault(gpu.name, gpu)  # the catalog's GPUs, slowest first
    # every option's store has a layout (build_advice kept only those)
    layouts = {o.store: layout for o in opts if (layout := store_layout(cells, o.store)) is not None}
    return [DeviceFeeds(d, {o.label: feed(d, layouts[o.store], o.loader, plan.storage, ref["batch_size"])
                            for o in opts}) for d in devices.values()]


def _with_efficiency(accelerators: dict[str, Accelerator], scenario: Scenario | None) -> dict[str, Accelerator]:
    """The scenario's accelerator efficiency, where it sets one, on every estimated profile."""
    if scenario is None or scenario.efficiency is None:
        return accelerators
    from trainfeed.benchmarks.model.profiles import ACCELERATORS

    out = {k: replace(v, efficiency=scenario.efficiency) for k, v in ACCELERATORS.items()}
    return out | accelerators


def gains(head: HeadlineNode, plan: Plan) -> Gains | None:
    """On one node: what repacking gains over the user's loader, and what better loading alone
    (trainfeed's reader on the same small files) would gain."""
    blob = [r for r in head.rows if r["store"] == "blob"]
    compacted = [r for r in head.rows if r["store"] != "blob"]
    if not blob or not compacted:
        return None
    today = next((r for r in blob if plan.baseline and r["loader"] == plan.baseline.name), blob[0])
    better = next((r for r in blob if r["loader"] == plan.reader.name), None)
    best = min(compacted, key=lambda r: r["seconds"])
    return Gains(node=head.node, today=today["option"], today_s=today["seconds"],
                 repacked=best["option"], repacked_s=best["seconds"],
                 repack_gain=today["seconds"] / best["seconds"], repack_level=level(today, best),
                 better_loading=better["option"] if better and better is not today else None,
                 better_loading_gain=today["seconds"] / better["seconds"] if better and better is not today else None)


class ReferenceRow(TypedDict):
    """One of the scenario's published times beside its projection."""

    node: str
    store: str
    projected_s: float | None
    reference_s: float
    deviation: float | None
    source: str
    bottleneck: str | None
    usd_per_hour: float | None
    projected_usd: float | None
    reference_usd: float | None


@dataclass(frozen=True, slots=True)
class Speedup:
    """On one node: blob time / compacted time, published and projected."""

    node: str
    published: float
    projected: float
    deviation: float


@dataclass(frozen=True, slots=True)
class CrossCheck:
    """On one node whose compacted run is compute-bound: the device's step time its published time
    implies (``slower`` times the projection's), and the small files projected again with it
    against their own published time."""

    node: str
    device: str
    device_how: str
    step_s: float
    implied_step_s: float
    slower: float
    blob_projected_s: float
    blob_reference_s: float
    blob_deviation: float


@dataclass(frozen=True, slots=True)
class Reference:
    """A scenario's published times beside the projections (``rows``, as reference.json and
    `storage-bench report --json` hold them), the speed-ups, the cross-checks, the scenario's
    sources (knob -> where its value comes from) and whether every figure is within 25%."""

    rows: list[ReferenceRow]
    speedups: list[Speedup]
    cross_checks: list[CrossCheck]
    sources: dict[str, str]
    within_25pct: bool


def reference(headline: list[HeadlineNode], plan: Plan) -> Reference:
    """The scenario's published times beside the projections, each with its deviation, and the
    speed-ups (blob time / compacted time) on each node, published and projected."""
    sc = plan.scenario
    assert sc is not None, "reference() is only asked for a scenario's plan"
    rows: list[ReferenceRow] = []
    for ref in sc.references:
        head = next((h for h in headline if h.node == ref.node), None)
        row = next((r for r in head.rows if r["store"] == ref.store
                    and r["loader"] == sc.loader_for(ref.store).name), None) if head else None
        projected = row["seconds"] if row else None
        hourly = row["usd_per_hour"] if row else None
        rows.append({"node": ref.node, "store": ref.store, "projected_s": projected, "reference_s": ref.seconds,
                     "deviation": projected / ref.seconds - 1 if projected else None, "source": ref.source,
                     "bottleneck": row["bottleneck"] if row else None, "usd_per_hour": hourly,
                     "projected_usd": row["usd_per_job"] if row else None,
                     "reference_usd": hourly * ref.seconds / 3600 if hourly else None})
    speedups: list[Speedup] = []
    cross: list[CrossCheck] = []
    for node in dict.fromkeys(r["node"] for r in rows):
        check = cross_check(next(h for h in headline if h.node == node), [r for r in rows if r["node"] == node], sc)
        if check:
            cross.append(check)
        mine = {r["store"]: r for r in rows if r["node"] == node}
        blob, compacted = mine.get("blob"), next((r for s, r in mine.items() if s != "blob"), None)
        if blob and compacted and blob["projected_s"] and compacted["projected_s"]:
            published = blob["reference_s"] / compacted["reference_s"]
            projected = blob["projected_s"] / compacted["projected_s"]
            speedups.append(Speedup(node=node, published=published, projected=projected,
                                    deviation=projected / published - 1))
    return Reference(rows=rows, speedups=speedups, cross_checks=cross, sources=sc.sources,
                     within_25pct=all(r["deviation"] is not None and abs(r["deviation"]) <= 0.25 for r in rows)
                     and all(abs(s.deviation) <= 0.25 for s in speedups))


def cross_check(head: HeadlineNode, rows: list[ReferenceRow], sc: Scenario) -> CrossCheck | None:
    """Which knob would have to move, and whether the rest of the model holds if it did: when a
    node's compacted run is compute-bound, its published time implies the device's speed (the
    one knob no source here gives); the small files' time is then projected again with that
    device and compared with its own published time, which it was not derived from."""
    blob = next((r for r in rows if r["store"] == "blob"), None)
    comp = next((r for r in rows if r["store"] != "blob"), None)
    if not blob or not comp or not comp["projected_s"] or comp["bottleneck"] != "compute":
        return None
    slower = comp["reference_s"] / comp["projected_s"]
    machine = head.machine
    assert head.project is not None, "a scenario's headline node projects its options on another machine"
    implied = replace(machine, device=replace(machine.device, step_s=machine.device.step_s * slower))
    again = next(r for r in head.project(implied)
                 if r["store"] == "blob" and r["loader"] == sc.loader_for("blob").name)
    return CrossCheck(node=head.node, device=machine.device.name, device_how=machine.device.how,
                      step_s=machine.device.step_s, implied_step_s=implied.device.step_s, slower=slower,
                      blob_projected_s=again["seconds"], blob_reference_s=blob["reference_s"],
                      blob_deviation=again["seconds"] / blob["reference_s"] - 1)


def significant(value: float, digits: int = 2) -> float:
    """``value`` rounded to ``digits`` significant figures."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))
