"""What to do when the host's CPU cannot feed the GPUs (the preprocessing bottleneck: decode, or
the storage client's I/O CPU): how many vCPUs an instance needs for this pipeline (I/O, decode
and the framework, ``model.feed``), and three remedies projected with the same model, time and
cost — a larger CPU:GPU instance, storing decoded pixels, and offloading reading and
preprocessing to separate CPU workers (tf.data service)."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import cast

from trainfeed.benchmarks.model.catalog import DbuRate, Instance
from trainfeed.benchmarks.model.cost import Workload, machine_of_instance, projection_row, store_layout
from trainfeed.benchmarks.model.profiles import Accelerator, ObjectStore
from trainfeed.benchmarks.model.projection import COMPUTE, DECODE, IO_CPU, Feed, Layout, Loader, Machine, feed
from trainfeed.benchmarks.records import ProjectionRow, Record

#: CPU per sample of the offload workers' decode relative to the reader's: tf.data service
#: workers decode with TensorFlow's ops, 373 samples per CPU-second against Pillow's reduced-scale
#: 1,004 for 360x480 JPEGs at 64x64 (`make bench-decode`, docs/BENCHMARKS.md).
OFFLOAD_CPU_FACTOR = 1004 / 373
#: GPU rows the report shows remedies for: the cheapest host-CPU-bound ones.
SHOWN = 5
#: The bottlenecks the remedies are for: the host's vCPUs cannot keep the GPUs busy.
HOST_CPU_BOUND = (DECODE, IO_CPU)


@dataclass(frozen=True, slots=True)
class Remedy:
    """One GPU instance bound by its vCPUs: its projection row today, the vCPUs it needs, and each
    remedy's projection row (None where the catalog has no candidate): a larger CPU:GPU instance
    (its row holds ``workers``, the reader threads), the decoded pixels' store, offloading to CPU
    workers (its row holds ``workers``, ``worker``, ``worker_vcpus``)."""

    today: ProjectionRow
    vcpus_needed: int
    bigger: ProjectionRow | None
    decoded: ProjectionRow | None
    offload: ProjectionRow | None


def remedies(cells: list[Record], catalog: list[Instance], store: str, decoded: str | None, loader: Loader,
             storage: ObjectStore | None, workload: Workload, projections: dict[str, list[ProjectionRow]], *,
             accelerators: dict[str, Accelerator] | None = None,
             dbu: dict[str, DbuRate] | None = None) -> list[Remedy]:
    """For the cheapest GPU instances on which ``store`` (encoded images) is bound by the host's
    CPU (decode or I/O CPU): the vCPUs they need, and each remedy's row (None where the catalog
    has no candidate)."""
    layout = store_layout(cells, store)
    rows = [r for r in projections.get(store, []) if r["gpus"] and r["bottleneck"] in HOST_CPU_BOUND]
    if layout is None or not rows:
        return []
    by_name = {i.name: i for i in catalog}
    batch = next(c for c in cells if c["kind"] == "cell")["batch_size"]
    dbu = dbu or {}

    def row(machine: Machine, inst: Instance, lay: Layout = layout, threads: int | None = None) -> ProjectionRow:
        return projection_row(machine, lay, replace(loader, threads=threads or loader.threads), storage, batch,
                              workload, inst, dbu=dbu.get(inst.cloud))

    out: list[Remedy] = []
    for today in sorted(rows, key=lambda r: (r["usd_per_job"] is None, r["usd_per_job"] or 0))[:SHOWN]:
        inst = by_name[today["machine"]]
        needs = feed(_machine(inst, cells, accelerators).device, layout, loader, storage, batch,
                     today["limits"][COMPUTE])  # every GPU of the instance at its own rate
        need = needs.vcpus
        bigger = _bigger(inst, need, catalog)
        bigger_row = None
        if bigger is not None:  # with enough reader threads: the instance's vCPUs, or what the pipeline needs
            threads = min(bigger.vcpus, max(need, loader.threads))
            bigger_row = row(_machine(bigger, cells, accelerators), bigger, threads=threads)
            bigger_row["workers"] = threads
        decoded_row = (next((r for r in projections.get(decoded, []) if r["machine"] == inst.name), None)
                       if decoded else None)
        out.append(Remedy(today=today, vcpus_needed=need, bigger=bigger_row, decoded=decoded_row,
                          offload=_offload(inst, needs, layout, cells, catalog, accelerators, row)))
    return out


def _bigger(inst: Instance, need: int, catalog: list[Instance]) -> Instance | None:
    """The cheapest instance of the same cloud with the same GPUs and at least ``need`` vCPUs
    (the instance itself when it has them: then more reader threads are the remedy)."""
    fits = [i for i in catalog if i.cloud == inst.cloud and i.gpu_model == inst.gpu_model and i.gpus == inst.gpus
            and i.vcpus >= need and i.on_demand is not None]
    return min(fits, key=lambda i: cast(float, i.on_demand), default=None)  # fits are all priced


def _machine(inst: Instance, cells: list[Record], accelerators: dict[str, Accelerator] | None) -> Machine:
    """A GPU instance as the model sees it, for one whose GPU the projections already modelled
    (an instance of the catalog's projections, or one with the same GPUs)."""
    machine = machine_of_instance(inst, cells, accelerators)
    assert machine is not None, f"{inst.name}: its GPU has no profile"
    return machine


def _offload(inst: Instance, needs: Feed, layout: Layout, cells: list[Record], catalog: list[Instance],
             accelerators: dict[str, Accelerator] | None, row: Callable[..., ProjectionRow]) -> ProjectionRow | None:
    """The GPU instance plus k CPU instances of the same cloud (the cheapest fleet with the vCPUs
    needed) running tf.data service workers: their vCPUs read (the storage client's I/O CPU)
    and decode, at TensorFlow's CPU cost per sample."""
    workers = [(i, price) for i in catalog
               if i.cloud == inst.cloud and not i.gpus and (price := i.on_demand) is not None]
    if not workers:
        return None
    offload_need = math.ceil(round(needs.decode * OFFLOAD_CPU_FACTOR + needs.io, 6))
    # the cheapest fleet that has the vCPUs: k of one CPU instance type
    count, worker, price = min(((max(1, math.ceil(offload_need / w.vcpus)), w, p) for w, p in workers),
                               key=lambda kwp: (kwp[0] * kwp[2], kwp[0] * kwp[1].vcpus))
    vcpus = count * worker.vcpus
    gpu_machine = _machine(inst, cells, accelerators)
    machine = replace(gpu_machine, name=f"{inst.name} + {count} x {worker.name}", vcpus=vcpus)
    heavier = replace(layout, cpu_s_per_sample=layout.cpu_s_per_sample * OFFLOAD_CPU_FACTOR)
    projected = row(machine, inst, heavier, threads=vcpus)
    if projected["usd_per_hour"] is not None:
        projected["usd_per_hour"] += price * count  # the worker's hourly cost: on demand, no DBUs
        projected["usd_per_job"] = projected["usd_per_hour"] * projected["seconds"] / 3600
        projected["usd_per_1k_samples"] = (projected["usd_per_job"] / projected["seconds"]
                                           / projected["samples_per_s"] * 1000)
    projected.update(spot_usd_per_hour=None, spot_usd_per_job=None, workers=count, worker=worker.name,
                     worker_vcpus=vcpus)
    return projected
