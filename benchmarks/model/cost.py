"""Time and cost of the user's full workload on each instance of the catalog: ``projection.project``
of the quantities measured here (see projection.py), priced per hour and per job.

The measured quantities travel to an instance as they are, except where the instance differs
from this machine: its vCPUs (the reader's threads are capped by them), its GPUs (their step
time from the accelerator profile: calibrated if measured, else estimated), its network. CPU
work per sample and per step can be scaled by ``cpu_speed`` (the instance's per-vCPU speed
relative to this machine; 1.0 unless a scenario sources another figure).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from trainfeed.benchmarks.model.catalog import DbuRate, Instance, hourly_cost
from trainfeed.benchmarks.model.measured import device_of, layout_of
from trainfeed.benchmarks.model.noise import spread
from trainfeed.benchmarks.model.profiles import ACCELERATORS, Accelerator, ObjectStore, calibration_key, step_seconds
from trainfeed.benchmarks.model.projection import COMPUTE, Device, Layout, Loader, Machine, Projection, feed, project
from trainfeed.benchmarks.records import ProjectionRow, Record

GPU_PROFILES = {"NVIDIA T4": "t4", "NVIDIA V100": "v100", "NVIDIA A10G": "a10g", "NVIDIA A100": "a100",
                "NVIDIA H100": "h100"}


@dataclass(frozen=True)
class Workload:
    samples: int  # per epoch
    epochs: int

    @property
    def total(self) -> int:
        return self.samples * self.epochs


@dataclass(frozen=True)
class Spot:
    """What preemption costs a spot run: trainfeed checkpoints on SIGTERM (the clouds give notice
    before they reclaim a spot VM) and resumes with --resume, so an interruption loses the restart
    time, not the work since the last checkpoint."""

    interruptions_per_hour: float = 0.05
    restart_s: float = 300.0
    source: str = ("assumed: 5% chance of an interruption per hour, 5 min to get a new VM, start and resume "
                   "(set yours from the provider's eviction history)")

    def stretch(self, seconds: float) -> float:
        return seconds * (1 + self.interruptions_per_hour * self.restart_s / 3600)


def store_layout(cells: list[Record], store: str) -> Layout | None:
    """One store's per-sample read cost: the median over its measured cells (every cell read
    the store through the same reader)."""
    layouts = [layout_of(c) for c in cells if c["kind"] == "cell" and c["store"] == store]
    if not layouts:
        return None
    return Layout(store, statistics.median(x.cpu_s_per_sample for x in layouts),
                  statistics.median(x.bytes_per_sample for x in layouts),
                  statistics.median(x.request_bytes for x in layouts), layouts[0].how,
                  statistics.median(x.dataset_bytes_per_sample for x in layouts))


def repeat_layouts(cells: list[Record], store: str) -> list[Layout]:
    """The store's layout from each repeat's cells alone, one per repeat that measured it: what
    ``noise.spread`` projects to see how far a projection moves between repeats."""
    repeats = dict.fromkeys(c["repeat"] for c in cells if c["kind"] == "cell" and c["store"] == store)
    return [lay for k in repeats if (lay := store_layout([c for c in cells if c["repeat"] == k], store))]


def gpu_device(model: str, count: int, cell: Record, accelerators: dict[str,
               Accelerator] | None = None) -> Device | None:
    """``count`` GPUs of ``model`` computing the cell's step: the profile's calibrated step time
    for this shape and batch, else its estimate. None for a GPU without a profile."""
    name = GPU_PROFILES.get(model)
    if name is None:
        return None
    acc = (accelerators or {}).get(name) or ACCELERATORS[name]
    key = calibration_key(cell["sample_shape"], cell["batch_size"], cell["width"], False)
    step_s, how = step_seconds(acc, cell["flops_per_step"], key)
    return Device(name, count, step_s, how)


def cpu_device(cells: list[Record]) -> Device | None:
    """This machine's CPU as a device: CPU-seconds of one training step, measured (the median
    over the CPU cells; None when no cell ran on the CPU)."""
    devices = [device_of(c) for c in cells if c["kind"] == "cell" and c["node"] == "cpu"]
    if not devices:
        return None
    return Device("cpu", 0, statistics.median(d.step_s for d in devices), devices[0].how)


def machine_of_instance(inst: Instance, cells: list[Record], accelerators: dict[str, Accelerator] | None = None,
                        cpu_speed: float = 1.0) -> Machine | None:
    """The instance as the model sees it; None when its device cannot be modelled (a GPU
    without a profile, or a CPU instance when no cell measured the CPU step)."""
    ref = next(c for c in cells if c["kind"] == "cell")
    if inst.gpus:
        device = gpu_device(inst.gpu_model, inst.gpus, ref, accelerators)
    else:
        device = cpu_device(cells)
        if device is not None:
            device = replace(device, step_s=device.step_s / cpu_speed)
    if device is None:
        return None
    return Machine(inst.name, inst.vcpus, device, inst.network_gbps)


def projection_row(machine: Machine, layout: Layout, loader: Loader, storage: ObjectStore | None, batch: int,
                   workload: Workload, inst: Instance | None = None, *, cpu_speed: float = 1.0,
                   dbu: DbuRate | None = None, spot: Spot = Spot(),
                   repeats: list[Layout] | None = None) -> ProjectionRow:
    """One row of every projection table: the rate, time and cost of ``workload`` on ``machine``
    reading ``layout`` with ``loader``; the same function for the headline, the catalog and
    the scenario, so their rows for one machine are equal. ``repeats``: the layout of each
    repeat alone (``repeat_layouts``), whose projections give the row's ``spread``."""
    if cpu_speed != 1.0:
        layout = replace(layout, cpu_s_per_sample=layout.cpu_s_per_sample / cpu_speed)
        repeats = [replace(lay, cpu_s_per_sample=lay.cpu_s_per_sample / cpu_speed) for lay in repeats or []]
    proj: Projection = project(machine, layout, loader, storage, batch)
    seconds = proj.seconds(workload.total)
    needed = feed(machine.device, layout, loader, storage, batch, proj.limits[COMPUTE]).vcpus \
        if machine.device.is_gpu else None
    row = {"machine": machine.name, "vcpus": machine.vcpus, "vcpus_needed": needed, "gpus": machine.device.count,
           "device": machine.device.name, "device_how": machine.device.how, "store": layout.store,
           "loader": loader.name, "samples_per_s": proj.samples_per_s, "seconds": seconds,
           "bottleneck": proj.bottleneck, "limits": proj.limits, "serial": proj.serial,
           "usd_per_hour": None, "usd_per_job": None, "spot_usd_per_hour": None, "spot_usd_per_job": None,
           "usd_per_1k_samples": None, "spread": spread(machine, repeats or [], loader, storage, batch)}
    if inst is not None:
        row["ram_note"] = ram_note(workload.samples * layout.dataset_bytes_per_sample, inst.ram_gib)
        row.update(cloud=inst.cloud, region=inst.region, price_date=inst.price_date, price_source=inst.source)
        hourly, spot_hourly = hourly_cost(inst, dbu=dbu), hourly_cost(inst, spot=True, dbu=dbu)
        if hourly:
            row.update(usd_per_hour=hourly, usd_per_job=hourly * seconds / 3600,
                       usd_per_1k_samples=hourly * seconds / 3600 / workload.total * 1000)
        if spot_hourly:
            row.update(spot_usd_per_hour=spot_hourly, spot_usd_per_job=spot_hourly * spot.stretch(seconds) / 3600)
    return row


#: Share of RAM the page cache can hold a dataset in, the rest kept for the job itself.
PAGE_CACHE_SHARE = 0.8


def ram_note(dataset_bytes: float, ram_gib: float | None) -> str | None:
    """Whether one epoch's bytes fit in the page cache of an instance (epochs after the first
    then read memory, not storage, when read from local disk or through --cache-dir)."""
    if not ram_gib:
        return None
    gib, room = dataset_bytes / 2**30, PAGE_CACHE_SHARE * ram_gib
    fits = "fits in" if gib <= room else "does not fit in"
    return f"dataset ({gib:,.1f} GiB) {fits} {PAGE_CACHE_SHARE:.0%} of RAM ({room:,.1f} of {ram_gib:,.0f} GiB)"


def project_catalog(cells: list[Record], catalog: list[Instance], store: str, loader: Loader,
                    storage: ObjectStore | None, workload: Workload, *,
                    accelerators: dict[str, Accelerator] | None = None, cpu_speeds: dict[str, float] | None = None,
                    dbu: dict[str, DbuRate] | None = None) -> list[ProjectionRow]:
    """Every catalog instance the model can project for one store read with one loader, the
    cheapest and fastest marked; sorted by cost per job (unpriced last), then time.
    ``cpu_speeds``: per-vCPU speed relative to this machine by instance name (default 1.0)."""
    layout = store_layout(cells, store)
    if layout is None:
        return []
    batch = next(c for c in cells if c["kind"] == "cell")["batch_size"]
    repeats = repeat_layouts(cells, store)
    rows = []
    for inst in catalog:
        speed = (cpu_speeds or {}).get(inst.name, 1.0)
        machine = machine_of_instance(inst, cells, accelerators, speed)
        if machine is not None:
            rows.append(projection_row(machine, layout, loader, storage, batch, workload, inst, cpu_speed=speed,
                                       dbu=(dbu or {}).get(inst.cloud), repeats=repeats))
    mark_extremes(rows)
    return sorted(rows, key=lambda r: (r["usd_per_job"] is None, r["usd_per_job"] or 0, r["seconds"]))


def mark_extremes(rows: list[ProjectionRow]) -> None:
    """Flag the fastest row and the cheapest priced one (ties: the first), and each row's ratio
    to them."""
    if not rows:
        return
    fastest = min(rows, key=lambda r: r["seconds"])
    priced = [r for r in rows if r["usd_per_job"]]
    cheapest = min(priced, key=lambda r: r["usd_per_job"]) if priced else None
    for r in rows:
        r["fastest"], r["cheapest"] = r is fastest, r is cheapest
        r["time_vs_fastest"] = r["seconds"] / fastest["seconds"]
        r["cost_vs_cheapest"] = r["usd_per_job"] / cheapest["usd_per_job"] if cheapest and r["usd_per_job"] else None


@dataclass(frozen=True, slots=True)
class Recommendation:
    """The cheapest priced (store, instance) and the fastest, across stores: two projection rows."""

    cheapest: ProjectionRow
    fastest: ProjectionRow

    def to_json(self) -> dict[str, ProjectionRow]:
        """As `storage-bench report --json` prints it (the rows as they are)."""
        return {"cheapest": self.cheapest, "fastest": self.fastest}


def recommend(projections: dict[str, list[ProjectionRow]]) -> Recommendation | None:
    """The cheapest priced (store, instance) and the fastest, across stores."""
    rows = [r for rs in projections.values() for r in rs if r.get("usd_per_job")]
    if not rows:
        return None
    return Recommendation(cheapest=min(rows, key=lambda r: r["usd_per_job"]),
                          fastest=min(rows, key=lambda r: r["seconds"]))
