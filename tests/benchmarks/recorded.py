"""Recorded cells as `storage-bench run` writes them to results.jsonl, with chosen measures:
the verdict, cost and report tests state every number they depend on."""
from __future__ import annotations

from trainfeed.benchmarks.matrix import RESULTS_VERSION, verdict


def cell(store: str = "parquet", node: str = "t4", framework: str = "torch", *, compute: float = 100.0,
         ingest: float | None = 100.0, real: float = 100.0, stall: float = 0.0, cores: int = 4,
         swap_mb: float = 0.0, node_kind: str = "emulated", profile: str | None = None, backend: str = "local",
         workers: int = 4, io_concurrency: int | None = 8, batch_size: int = 10, flops_per_step: float = 1e12,
         sample_bytes: int = 4000, timeline: list[dict] | None = None, stages: dict | None = None) -> dict:
    rec = {
        "kind": "cell", "results_version": RESULTS_VERSION, "repeat": 0, "store": store, "node": node,
        "framework": framework, "batch_size": batch_size, "width": 8, "sample_shape": [10, 10, 4, 2],
        "sample_bytes": sample_bytes, "flops_per_step": flops_per_step, "node_kind": node_kind,
        "image_storage": None if stages is None else "encoded", "stages": stages,
        "storage": {"backend": backend, "url": f"/stores/{store}", "profile": profile},
        "connections": {"reader_workers": workers, "io_concurrency": io_concurrency},
        "env": {"cores": cores, "ram_gb": 16.0, "gpu": None},
        "compute_only": {"step_s": batch_size / compute, "samples_per_s": compute,
                         "how": "measured" if node_kind == "real" else "estimate"},
        "ingest_only": {"samples_per_s": ingest},
        "real": {"samples_per_s": real, "mb_per_s": real * sample_bytes / 1e6, "stall_fraction": stall,
                 "au": 1 - stall, "utilization": {"swap_used_mb_mean": swap_mb, "cpu_percent_mean": 50.0,
                                                  "rss_mb_max": 300.0},
                 "utilization_timeline": timeline or []},
    }
    return {**rec, "verdict": verdict(rec)}


def error(store: str, node: str, message: str, stage: str = "cell", framework: str = "torch") -> dict:
    return {"kind": "error", "results_version": RESULTS_VERSION, "repeat": 0, "store": store, "node": node,
            "framework": framework, "stage": stage, "error": message,
            "env": {"cores": 4, "ram_gb": 16.0, "gpu": None}}


def location(store: str, *, local: float, on_storage: float, backend: str = "azurite",
             profile: str | None = "azure-blob", workers: int = 4, io_concurrency: int | None = 8) -> dict:
    """The location-effect record: one compacted store's ingest-only rate on the backend and
    from a local copy."""
    return {"kind": "location-effect", "results_version": RESULTS_VERSION, "repeat": 0, "store": store,
            "storage": {"backend": backend, "url": f"abfs://trainfeed/stores/{store}", "profile": profile},
            "connections": {"reader_workers": workers, "io_concurrency": io_concurrency},
            "env": {"cores": 4, "ram_gb": 16.0, "gpu": None}, "local_copy": f"/out/local-copy/{store}",
            "on_storage": {"samples_per_s": on_storage}, "local_disk": {"samples_per_s": local}}
