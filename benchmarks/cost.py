"""Time / cost projections of the user's full workload per instance.

How a projection is made (also printed in the report):
- GPU instance: compute rate = batch / step time of its GPU profile (calibrated if measured,
  else FLOPs / (peak x efficiency), an estimate) x GPU count; input rate = the store's
  ingest-only rate measured here x (instance vCPUs / local cores) — read and decode scale
  with vCPUs; the projected rate is the smaller of the two.
- CPU instance: the real CPU-node rate measured here x (instance vCPUs / local cores).
Linear scaling in vCPUs is an assumption; calibrate on the real instance to replace it.
"""
from __future__ import annotations

import math

from .catalog import CATALOG, Instance, load_catalog
from .profiles import ACCELERATORS, calibration_key, step_seconds

__all__ = ["CATALOG", "GPU_PROFILES", "Instance", "load_catalog", "project", "recommend"]
GPU_PROFILES = {"NVIDIA T4": "t4", "NVIDIA V100": "v100", "NVIDIA A10G": "a10g", "NVIDIA A100": "a100",
                "NVIDIA H100": "h100"}


def project(cells: list[dict], catalog: list[Instance], store: str, *, target_samples: int, epochs: int) -> list[dict]:
    """Projected time and cost of ``target_samples x epochs`` on each instance, from the
    measured cells of one store."""
    mine = [c for c in cells if c["kind"] == "cell" and c["store"] == store]
    if not mine:
        return []
    local_cores = mine[0]["env"]["cores"]
    ingest = _median([c["ingest_only"]["samples_per_s"] for c in mine])
    cpu_cells = [c for c in mine if c["node"] == "cpu"]
    cpu_rate = _median([c["real"]["samples_per_s"] for c in cpu_cells]) if cpu_cells else None
    ref = mine[0]
    total = target_samples * epochs
    out = []
    for inst in catalog:
        scale = inst.vcpus / local_cores
        row = {"cloud": inst.cloud, "region": inst.region, "instance": inst.name, "vcpus": inst.vcpus,
               "gpus": inst.gpus, "gpu_model": inst.gpu_model, "ram_gib": inst.ram_gib, "store": store}
        if inst.gpus:
            profile = GPU_PROFILES.get(inst.gpu_model)
            if profile is None:
                continue  # no step-time profile for this GPU (K80, M60, L4, Gaudi): not projected
            acc = ACCELERATORS[profile]
            key = calibration_key(ref["sample_shape"], ref["batch_size"], ref["width"], False)
            step_s, how = step_seconds(acc, ref["flops_per_step"], key)
            compute_rate = ref["batch_size"] / step_s * inst.gpus
            feed_rate = ingest * scale
            rate = min(compute_rate, feed_rate)
            if feed_rate < compute_rate:
                need = math.ceil(local_cores * compute_rate / ingest)
                constraint = f"input pipeline: needs ~{need} vCPUs to feed {inst.gpus} GPU(s), has {inst.vcpus}"
            else:
                constraint = f"GPU compute ({how})"
            basis = f"min(GPU {how}, ingest measured x {scale:.1f})"
        else:
            if cpu_rate is None:
                continue
            rate = cpu_rate * scale
            constraint, basis = "CPU compute", f"CPU-node rate measured x {scale:.1f}"
        hours = total / rate / 3600
        row.update(samples_per_s=rate, hours=hours, constraint=constraint, basis=basis,
                   on_demand_usd=hours * inst.on_demand if inst.on_demand else None,
                   spot_usd=hours * inst.spot if inst.spot else None,
                   price_date=inst.price_date, price_source=inst.source)
        dataset_gib = target_samples * ref["sample_bytes"] / 2**30
        if inst.ram_gib and dataset_gib > 0.8 * inst.ram_gib:
            row["ram_note"] = f"dataset ({dataset_gib:.0f} GiB) does not fit in RAM ({inst.ram_gib:.0f} GiB): every epoch reads storage"
        out.append(row)
    fastest = min((r["hours"] for r in out), default=None)
    cheapest = min((r["on_demand_usd"] for r in out if r["on_demand_usd"]), default=None)
    for r in out:
        r["time_vs_fastest"] = r["hours"] / fastest if fastest else None
        r["cost_vs_cheapest"] = r["on_demand_usd"] / cheapest if cheapest and r["on_demand_usd"] else None
    return sorted(out, key=lambda r: (r["on_demand_usd"] is None, r["on_demand_usd"] or 0, r["hours"]))


def recommend(projections: dict[str, list[dict]]) -> dict | None:
    """The cheapest priced (store, instance), the fastest, and the constraint that binds."""
    rows = [r for rs in projections.values() for r in rs if r.get("on_demand_usd")]
    if not rows:
        return None
    cheapest = min(rows, key=lambda r: r["on_demand_usd"])
    fastest = min(rows, key=lambda r: r["hours"])
    return {"cheapest": cheapest, "fastest": fastest}


def _median(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
