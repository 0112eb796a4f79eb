"""Recorded cells as `storage-bench run` writes them to results.jsonl, with chosen measures:
the verdict, cost and report tests state every number they depend on."""
from __future__ import annotations

from trainfeed.benchmarks.matrix import RESULTS_VERSION, verdict


def cell(store: str = "parquet", node: str = "t4", framework: str = "torch", *, compute: float = 100.0,
         ingest: float | None = 100.0, real: float = 100.0, stall: float = 0.0, cores: int = 4,
         swap_mb: float = 0.0, node_kind: str = "emulated", blob_profile: str | None = None, workers: int = 4,
         batch_size: int = 10, flops_per_step: float = 1e12, sample_bytes: int = 4000,
         timeline: list[dict] | None = None) -> dict:
    rec = {
        "kind": "cell", "results_version": RESULTS_VERSION, "repeat": 0, "store": store, "node": node,
        "framework": framework, "batch_size": batch_size, "width": 8, "sample_shape": [10, 10, 4, 2],
        "sample_bytes": sample_bytes, "flops_per_step": flops_per_step, "blob_profile": blob_profile,
        "workers": workers, "node_kind": node_kind,
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
