"""Each cell's diagnosis: the projection model's binding constraint for the machine it ran on,
in words with its figures and what removes it, and the checks that say when a cell's figures
are less than they seem."""
from __future__ import annotations

import math
from typing import TypedDict

import numpy as np

from trainfeed.benchmarks.model.measured import STAGES, layout_of, loader_of, machine_of, storage_of
from trainfeed.benchmarks.model.profiles import ObjectStore
from trainfeed.benchmarks.model.projection import (
    COMPUTE,
    DECODE,
    IO_CPU,
    LATENCY,
    Feed,
    Projection,
    feed,
    in_flight,
    project,
)
from trainfeed.benchmarks.records import Record


class Verdict(TypedDict):
    """A cell's bottleneck (a projection's, or ``ram`` or ``contention``) and what removes it."""

    bottleneck: str
    advice: str


def checks(cell: Record) -> list[str]:
    """What makes a cell's figures less than they seem, in words: contention while it was
    measured, a real run faster than the reader alone allows, a step that took longer in the
    run than alone."""
    notes = []
    for what, rec in (("ingest-only", cell["ingest_only"]), ("real run", cell["real"])):
        load = rec.get("load") or {}
        if load.get("contended"):
            notes.append(f"{what} measured under contention ({'; '.join(load['reasons'])}): wall rates are low "
                         "and noisy; the projections use CPU time, which contention distorts far less")
    i, r = cell["ingest_only"]["samples_per_s"], cell["real"]["samples_per_s"]
    if i and r and r > 1.1 * i:
        notes.append(f"the real run ({r:,.0f} samples/s) beat the reader alone ({i:,.0f}): the reader reads ahead "
                     "during the real run's warm-up step, so its short window starts with full buffers; the "
                     "projections use the reader's CPU time per sample, not either rate")
    alone, inside = cell["compute_only"]["step_s"], cell["real"].get("compute_step_s")
    if cell.get("node_kind") == "real" and inside and not 0.5 <= inside / alone <= 2:
        notes.append(f"a step took {inside:.3f} s in the run and {alone:.3f} s alone (compute-only): "
                     "the machine's load changed between the two, or the step shares the CPU with the reader")
    return notes


#: A measurement shorter than this, or of fewer samples, is too short to mean anything: a rate
#: from it is reported as not measured, with the reason, never as a ratio.
MIN_TIMED_SECONDS = 0.5
MIN_TIMED_SAMPLES = 50
#: A real run this much above the model's bound contradicts the model (noise or a wrong input).
ABOVE_MODEL = 1.1


def too_short(measured: Record | None) -> str | None:
    """Why a timed measurement (an ingest-only pass: ``samples_per_s``, ``seconds``,
    ``timed_samples``) is too short to mean anything, or None when it is long enough (or older
    results do not record its duration)."""
    if not measured or not measured.get("samples_per_s"):
        return "not timed (too few batches: raise --steps or use more samples)"
    seconds, timed = measured.get("seconds"), measured.get("timed_samples")
    if (seconds is not None and seconds < MIN_TIMED_SECONDS) or (timed is not None and timed < MIN_TIMED_SAMPLES):
        took = ", ".join(x for x in (f"{seconds * 1e3:,.0f} ms" if seconds is not None else "",
                                     f"{timed:,} samples" if timed is not None else "") if x)
        return (f"too short to mean anything ({took} timed): a rate needs at least {MIN_TIMED_SECONDS:g} s and "
                f"{MIN_TIMED_SAMPLES} samples (raise --steps or use more samples)")
    return None


def doubts(cell: Record) -> list[str]:
    """What makes a cell's figures untrustworthy (beyond ``checks``), computed from its record:
    an ingest-only pass too short to mean anything, a real run above the model's own bound."""
    out = []
    short = too_short(cell["ingest_only"])
    if short:
        out.append(f"ingest-only {short}")
    proj = project(machine_of(cell), layout_of(cell), loader_of(cell), storage_of(cell), cell["batch_size"])
    real = cell["real"]["samples_per_s"] or 0.0
    if proj.samples_per_s and real > ABOVE_MODEL * proj.samples_per_s:
        out.append(f"measured above the model's bound (real {real:,.0f}/s, model {proj.samples_per_s:,.0f}/s): "
                   "the model's inputs from this run (the reader's CPU per sample, the storage profile) or the "
                   "timing are off; the report's confidence is lowered")
    return out


#: A measured real run below this share of what the model allows is flagged, not explained away.
BELOW_MODEL = 0.8


def verdict(cell: Record) -> Verdict:
    """The bottleneck of one cell and concrete advice: the projection model's binding constraint
    for this machine (``model.project`` of the cell's measured quantities), unless the
    measurements say otherwise: the node swapped, or the device should have set the pace but the
    real run fell well below it (the reader and the step, or other processes, took its CPU).
    Other processes' load is a caveat of the figures (the cell's checks), not a bottleneck of
    the pipeline."""
    proj = project(machine_of(cell), layout_of(cell), loader_of(cell), storage_of(cell), cell["batch_size"])
    real = cell["real"]
    r = real["samples_per_s"] or 0.0
    if real.get("utilization", {}).get("swap_used_mb_mean", 0) > 100:
        return {"bottleneck": "ram", "advice": "RAM: the working set exceeds memory and the node swaps; "
                "pick an instance with more RAM or lower --workers / --shuffle-buffer"}
    cores = cell["env"]["cores"]
    load = real.get("load") or {}
    if r < BELOW_MODEL * proj.samples_per_s and proj.bottleneck == COMPUTE:
        others = "; ".join(load.get("reasons") or []) or "nothing else was busy"
        return {"bottleneck": "contention", "advice": f"the real run reached {r:,.0f} samples/s where its parts "
                f"allow {proj.samples_per_s:,.0f} ({proj.bottleneck}-bound): the reader and the step compete for "
                f"{cores} vCPUs ({others}); give the input pipeline its own cores, or rerun on an idle machine"}
    return _advice(cell, proj)


def _advice(cell: Record, proj: Projection) -> Verdict:
    limits, b = proj.limits, proj.bottleneck
    device = limits.get(COMPUTE, 0.0)
    cores = cell["env"]["cores"]
    reading_cpu = proj.host_cpu[DECODE] + proj.host_cpu[IO_CPU]  # on the vCPUs, without the step
    feed_rate = min([v for k, v in limits.items() if k != COMPUTE] + ([cores / reading_cpu] if reading_cpu else []),
                    default=float("inf"))
    what = "accelerator" if cell.get("node_kind") == "emulated" else "CPU" if cell["node"] == "cpu" else "GPU"
    if b == COMPUTE:
        feed_text = (f"reading alone could deliver {feed_rate:,.0f}" if feed_rate != float("inf")
                     else "reading costs nothing measurable")
        shared = " with the reader on the same vCPUs" if cell["node"] == "cpu" else ""
        acc, co = cell.get("accelerator") or {}, cell["compute_only"]
        if co.get("how") == "estimate" and acc.get("step_floor_s") and math.isclose(co["step_s"], acc["step_floor_s"]):
            return {"bottleneck": "compute", "advice": f"compute-bound at the {cell['node']} profile's per-step floor "
                    f"({acc['step_floor_s'] * 1e3:,.0f} ms a step, an estimate: this model and batch are too small "
                    f"for its FLOPs to count; {proj.samples_per_s:,.0f} samples/s; {feed_text}). A faster GPU would "
                    "not shorten the step here; a larger batch, or `storage-bench calibrate` on the real GPU, says "
                    "more. Repacking does not help."}
        return {"bottleneck": "compute", "advice": f"compute-bound: the {what} sets the pace{shared} "
                f"({proj.samples_per_s:,.0f} samples/s; {feed_text}). A faster device or more devices help; "
                "repacking does not."}
    storage, loader, layout = storage_of(cell), loader_of(cell), layout_of(cell)
    need = feed(machine_of(cell).device, layout, loader, storage, cell["batch_size"], device)
    if b == DECODE:
        reading = int(np.ceil(round(need.io + need.decode, 6)))
        if cell.get("stages"):
            return image_verdict(cell, device, limits[DECODE], reading)
        return {"bottleneck": "decode", "advice": f"read/decode-bound: {layout.cpu_s_per_sample * 1e3:.2f} ms of CPU "
                f"per sample on {min(loader.threads, cores)} thread(s) -> {proj.samples_per_s:,.0f} samples/s, "
                f"the device takes {device:,.0f}; needs ~{reading} vCPUs busy reading per device (more --workers on "
                "more vCPUs), or offload preprocessing to CPU workers"}
    # what is left (the client's I/O CPU, latency, bandwidth) binds only when storage is modelled
    assert storage is not None, f"{b}-bound without a storage profile"
    if b == IO_CPU:
        return io_cpu_verdict(need, storage, cores, proj.samples_per_s)
    flight = in_flight(loader, storage) if storage else loader.concurrency
    more = "allow more requests in flight (--io-concurrency)"
    if b == LATENCY:
        return {"bottleneck": "io-latency", "advice": f"storage latency: {layout.request_bytes / 1e3:,.0f} KB requests "
                f"at {storage.first_byte_ms:.0f} ms first byte, {flight} in flight -> {limits[LATENCY]:,.0f} "
                f"samples/s, the device takes {device:,.0f}; repack into files of ~128 MB (convert --to delta) "
                f"or {more}"}
    return {"bottleneck": "bandwidth", "advice": f"bandwidth: {flight} streams of {storage.stream_mb_per_s:.0f} MB/s "
            f"-> {limits[b]:,.0f} samples/s of {layout.bytes_per_sample / 1e3:,.0f} KB, the device takes "
            f"{device:,.0f}; {more}, or store fewer bytes per sample (compression, smaller dtype)"}


def io_cpu_verdict(need: Feed, storage: ObjectStore, vcpus: int, rate: float) -> Verdict:
    """The storage client's CPU binds: what the device needs in GB/s, what that costs in vCPUs at
    the client's CPU per GB, beside decode and the framework, and what removes it."""
    return {"bottleneck": "io-cpu", "advice": f"I/O CPU: the storage client costs {need.io_cpu_s_per_gb:.2f} CPU-s "
            f"per GB at {need.in_flight} in flight ({storage.io_cpu_source}); the device takes "
            f"{need.samples_per_s:,.0f} samples/s = {need.gb_per_s:.2f} GB/s, which needs {need.describe()} where "
            f"this machine has {vcpus} -> {rate:,.0f} samples/s; give each device more vCPUs, or read fewer bytes "
            "per sample (compression, smaller dtype)"}


def image_verdict(cell: Record, device_rate: float, reader_rate: float, need: int) -> Verdict:
    """An image cell the projection model found read/decode-bound (its reader's CPU delivers
    ``reader_rate`` samples/s, the device takes ``device_rate``, which keeps ``need`` vCPUs busy
    reading): the stage that costs the most CPU per sample, and what removes it.

    ``need`` is the feed's (the "vCPUs to feed one GPU" table's): the reader's CPU per sample
    measured by the pass that read the samples (ingest-only's process CPU time, every thread)
    and the storage client's. The stages are not: each is the calling thread's CPU time over the
    first pieces at staging (``time.thread_time``), which misses what other threads do for the
    reader (the storage client's requests, the emulation) and the reader's own work around decode
    (its pools, shuffle, batching). 152 JPEGs behind emulated Azure Blob on the development VM:
    read, decode and augment took 0.10, 0.27 and 0.19 ms of the staging thread's CPU per image,
    0.78 ms of the process's; the reader's ingest-only pass, which does not augment, 0.82 ms.
    So the stages only say which costs most."""
    st = cell["stages"]
    ms = {s: f"{st[s] * 1e3:.3f} ms" for s in STAGES}
    costs = f"CPU per sample: read {ms['read']}, decode+resize {ms['decode']}, augment {ms['augment']}"
    binding = max(STAGES, key=lambda s: st[s])
    if binding == "augment":
        return {"bottleneck": "augment", "advice": f"augmentation-bound: {ms['augment']} CPU per image to crop, "
                f"resize and flip ({costs}); the reader delivers {reader_rate:,.0f} images/s, the device takes "
                f"{device_rate:,.0f} and needs ~{need} vCPUs at this rate; augment on the GPU or add CPUs"}
    if binding == "decode":
        ratio = st["pixel_bytes_per_sample"] / st["stored_bytes_per_sample"]
        return {"bottleneck": "decode", "advice": f"decode-bound: {ms['decode']} CPU per image to decode and resize "
                f"({costs}); the reader delivers {reader_rate:,.0f} images/s, the device takes {device_rate:,.0f} "
                f"and needs ~{need} vCPUs at this rate; store decoded pixels ({ratio:.1f}x the bytes) or add CPUs"}
    return {"bottleneck": "decode", "advice": f"read-bound: {ms['read']} CPU per image to read and parse its bytes "
            f"({costs}); the reader delivers {reader_rate:,.0f} images/s, the device takes {device_rate:,.0f} and "
            f"needs ~{need} vCPUs at this rate; repack into files of ~128 MB (fewer, larger reads) or add CPUs"}
