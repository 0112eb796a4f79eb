"""How the projections were made: the model, its bottlenecks, storage, sizes, step times and
prices, then the catalog's notes grouped one line per problem."""
from __future__ import annotations

import re

from trainfeed.benchmarks.model.advice import Advice
from trainfeed.benchmarks.model.cost import Spot
from trainfeed.benchmarks.model.noise import rule
from trainfeed.benchmarks.model.profiles import IO_CPU_SOURCE
from trainfeed.benchmarks.report.formatting import fmt_num


def method_section(advice: Advice, notes: list[str]) -> list[str]:
    """The model, its bottlenecks and every figure it takes, with where each comes from."""
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
        lines += ["Catalog notes:", ""] + [f"- {n}" for n in grouped_notes(notes)] + [""]
    return lines


def grouped_notes(notes: list[str]) -> list[str]:
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
