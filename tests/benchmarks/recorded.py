"""Recorded cells as `storage-bench run` writes them to results.jsonl, with chosen measures:
the verdict, cost and report tests state every number they depend on."""
from __future__ import annotations

from dataclasses import asdict

from trainfeed.benchmarks.ab.results import RESULTS_VERSION
from trainfeed.benchmarks.model.profiles import OBJECT_STORES
from trainfeed.benchmarks.model.verdict import checks, verdict


def cell(store: str = "parquet", node: str = "t4", framework: str = "torch", *, compute: float = 100.0,
         ingest: float | None = 100.0, real: float = 100.0, stall: float = 0.0, cores: int = 4,
         swap_mb: float = 0.0, node_kind: str = "emulated", profile: str | None = None, backend: str = "local",
         workers: int = 4, io_concurrency: int | None = 8, batch_size: int = 10, flops_per_step: float = 1e12,
         sample_bytes: int = 4000, timeline: list[dict] | None = None, stages: dict | None = None,
         cpu_ms: float = 0.1, requests: dict | None = None, samples: int = 100,
         cpu_step_s: float | None = None, contended: list[str] | None = None, accelerator: dict | None = None) -> dict:
    """One cell. ``cpu_ms``: the reader's CPU per sample; ``requests``: the emulation's counters
    over the ingest-only pass ({"gets", "bytes"}); ``cpu_step_s``: CPU-seconds of a step on a
    CPU node; ``contended``: the reasons the load monitor gave during the real run."""
    load = {"contended": bool(contended), "reasons": list(contended or [])}
    rec = {
        "kind": "cell", "results_version": RESULTS_VERSION, "repeat": 0, "store": store, "node": node,
        "framework": framework, "batch_size": batch_size, "width": 8, "sample_shape": [10, 10, 4, 2],
        "sample_bytes": sample_bytes, "flops_per_step": flops_per_step, "node_kind": node_kind,
        "image_storage": None if stages is None else "encoded", "stages": stages,
        "storage": {"backend": backend, "url": f"/stores/{store}", "profile": profile,
                    "profile_figures": asdict(OBJECT_STORES[profile]) if profile else None},
        "connections": {"reader_workers": workers, "io_concurrency": io_concurrency},
        "env": {"cores": cores, "ram_gb": 16.0, "gpu": None},
        "compute_only": {"step_s": batch_size / compute, "samples_per_s": compute,
                         "how": "measured" if node_kind == "real" else "estimate", "cpu_s_per_step": cpu_step_s},
        "ingest_only": {"samples_per_s": ingest, "samples": samples, "timed_samples": samples,
                        "cpu_s_per_sample": cpu_ms / 1e3, "requests": requests,
                        "load": {"contended": False, "reasons": []}},
        "real": {"samples_per_s": real, "mb_per_s": real * sample_bytes / 1e6, "stall_fraction": stall,
                 "au": 1 - stall, "utilization": {"swap_used_mb_mean": swap_mb, "cpu_percent_mean": 50.0,
                                                  "rss_mb_max": 300.0},
                 "utilization_timeline": timeline or [], "load": load},
    }
    if accelerator is not None:
        rec["accelerator"] = accelerator
    rec["checks"] = checks(rec)
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
