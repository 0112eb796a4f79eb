"""Ingest-only throughput of trainfeed's read engine, per format, next to the format's own floor
measured in the same run on the same files (page cache warm, no model):

- parquet, delta: ``pyarrow.parquet.ParquetFile.iter_batches`` over the store's files;
- hdf5: contiguous h5py slices of every dataset, in file order;
- blob: a plain threaded read of the small files' bytes.

Floors and the engine use the same number of threads (``--workers``, default 2); the engine
reads a shuffled epoch (seeded, shuffle buffer 256, batches of 32). ``vs_floor`` is the engine's
rate over the floor's, measured back to back (pairs share the machine's noise); ``cpu_vs_floor``
the floor's CPU seconds over the engine's for the same bytes (less sensitive to other load).

    python -m trainfeed.benchmarks.micro.loader_bench --out bench-out/loader.jsonl [--gb 0.3] [--repeats 3]

``--ragged``: the same samples also converted with ``convert --ragged`` (each sample's shape
stored beside it: the same tensor bytes), read after the fixed-shape store in each repeat as
stored (an object array of samples) and through ``fit=pad:SHAPE`` of their own shape (batches
bit for bit the fixed store's): what a ragged store costs against a fixed one, ``vs_fixed``.

Runs against any trainfeed that has ``open_store``/``iter_batches`` (to compare with an older
reader, run this file with that checkout's interpreter from its folder).
"""
from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import h5py
import pyarrow.parquet as pq

from trainfeed.benchmarks.micro.convert_bench import ensure_dataset
from trainfeed.converters.convert import ConvertConfig, convert
from trainfeed.converters.formats.options import OpenOptions, WriteOptions
from trainfeed.converters.layout import ID, LABEL
from trainfeed.converters.sources.decode import ArrayOptions
from trainfeed.training.metrics import environment
from trainfeed.training.reading.readers import iter_batches, open_store
from trainfeed.training.reading.store import EpochOptions

MB = 10**6
FORMATS = ("parquet", "delta", "hdf5", "blob")


def build_stores(src: Path, work: Path, ragged: bool = False) -> dict[str, Path]:
    """One store per writable format (uncompressed, default sizes), cached across runs; blob is the
    source. ``ragged``: also FORMAT-ragged, the same samples converted with --ragged."""
    out = {"blob": src}
    for fmt in ("parquet", "delta", "hdf5"):
        for suffix, arrays in (("", ArrayOptions()), *((("-ragged", ArrayOptions(ragged=True)),) if ragged else ())):
            dst = work / f"store-{src.name}-{fmt}{suffix}"
            if not dst.exists():
                convert(ConvertConfig(src=str(src), dst=str(dst), fmt=fmt, write=WriteOptions(),
                                      labels_csv=str(src / "labels.csv"), arrays=arrays))
            out[fmt + suffix] = dst
    return out


def floor(fmt: str, path: Path, workers: int) -> tuple[float, float, int]:
    """Seconds, CPU seconds (all threads) and tensor bytes of the format's own plain read of every sample,
    in file order, ``workers`` threads sharing the units (row groups, slices of whole chunks, files)."""
    store = open_store(str(path), fmt, OpenOptions(labels=str(path / "labels.csv") if fmt == "blob" else None))
    name = store.spec.name
    local = threading.local()

    def handle(f: str, opener: Callable[[str], Any]) -> Any:
        handles = local.__dict__.setdefault("handles", {})
        return handles.get(f) or handles.setdefault(f, opener(f))

    def parquet_unit(unit: tuple[str, int]) -> int:
        pf = handle(unit[0].removeprefix("file://"), pq.ParquetFile)
        return sum(b.num_rows for b in pf.iter_batches(row_groups=[unit[1]], columns=[ID, LABEL, name]))

    def hdf5_unit(unit: tuple[str, int, int]) -> int:
        h5 = handle(unit[0], lambda f: h5py.File(f, "r"))
        _f, start, stop = unit
        h5[ID][start:stop], h5[LABEL][start:stop], h5[name][start:stop]
        return stop - start

    def blob_unit(unit: Any) -> int:  # a blob piece: one file
        with open(unit.path, "rb") as fh:
            fh.read()
        return 1

    readers: dict[str, Callable[[Any], int]] = {"parquet": parquet_unit, "delta": parquet_unit, "hdf5": hdf5_unit,
                                                "blob": blob_unit}
    read = readers[fmt]
    t0, c0 = time.perf_counter(), time.process_time()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        rows = sum(pool.map(read, store.pieces))
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    sample_nbytes = store.spec.sample_nbytes
    assert sample_nbytes is not None, "the benchmark's samples all have one shape"
    return seconds, cpu, rows * sample_nbytes


def engine(fmt: str, path: Path, workers: int, fit: str | None = None) -> tuple[float, float, int]:
    """Seconds, CPU seconds (all threads) and tensor bytes of one shuffled epoch through trainfeed's reader."""
    opts = EpochOptions(batch_size=32, workers=workers, shuffle=True, shuffle_buffer=256, drop_last=False,
                        pool="arrow")
    store = open_store(str(path), fmt, OpenOptions(labels=str(path / "labels.csv") if fmt == "blob" else None,
                                                   fit=fit))
    t0, c0 = time.perf_counter(), time.process_time()
    nbytes = sum(batch.nbytes for batch in iter_batches(store, opts))
    return time.perf_counter() - t0, time.process_time() - c0, nbytes


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench-out/loader.jsonl")
    ap.add_argument("--work", default="bench-out/work")
    ap.add_argument("--gb", type=float, default=0.3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--label", default="", help="recorded with every line (e.g. which checkout ran it)")
    ap.add_argument("--ragged", action="store_true", help="also read the same samples stored with --ragged")
    args = ap.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    src = ensure_dataset(work, args.gb)
    stores = build_stores(src, work, args.ragged)
    shape = "x".join(map(str, open_store(str(stores["parquet"]), "parquet").spec.shape or ()))
    env = {**environment(), "page_cache": "warm (every store read by the floor and the engine once before timing)"}
    formats = args.formats.split(",")
    for fmt in formats:  # warm the page cache, and the code paths, for every layout alike
        floor(fmt, stores[fmt], args.workers)
        engine(fmt, stores[fmt], args.workers)
    records = []
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as out:
        for rep in range(args.repeats):
            for fmt in formats:
                floor_s, floor_cpu, floor_bytes = floor(fmt, stores[fmt], args.workers)
                seconds, cpu, nbytes = engine(fmt, stores[fmt], args.workers)
                assert nbytes == floor_bytes, \
                    f"{fmt}: the engine delivered {nbytes} bytes, the floor read {floor_bytes}"
                rec = {"bench": "loader", "format": fmt, "label": args.label, "repeat": rep,
                       "workers": args.workers, "mb": nbytes / MB, "floor_mb_per_s": floor_bytes / floor_s / MB,
                       "mb_per_s": nbytes / seconds / MB,
                       "vs_floor": (nbytes / seconds) / (floor_bytes / floor_s),
                       "cpu_s_per_gb": cpu / nbytes * 1e9, "floor_cpu_s_per_gb": floor_cpu / floor_bytes * 1e9,
                       "cpu_vs_floor": floor_cpu / cpu, "env": env}
                records.append(rec)
                out.write(json.dumps(rec) + "\n")
                out.flush()
                if args.ragged and fmt != "blob":
                    for variant, fit in (("ragged", None), ("ragged+fit", f"pad:{shape}")):
                        r_seconds, r_cpu, r_bytes = engine(fmt, stores[fmt + "-ragged"], args.workers, fit)
                        assert r_bytes == nbytes, f"{fmt} {variant}: {r_bytes} bytes, the fixed store {nbytes}"
                        rec = {"bench": "loader", "format": fmt, "variant": variant, "label": args.label,
                               "repeat": rep, "workers": args.workers, "mb": r_bytes / MB,
                               "mb_per_s": r_bytes / r_seconds / MB, "cpu_s_per_gb": r_cpu / r_bytes * 1e9,
                               "vs_fixed": seconds / r_seconds, "cpu_vs_fixed": r_cpu / cpu, "env": env}
                        records.append(rec)
                        out.write(json.dumps(rec) + "\n")
                        out.flush()
    print(summarize(records))


def summarize(records: list[dict[str, Any]]) -> str:
    lines = [f"{'format':<10}{'engine MB/s':>12}{'floor MB/s':>12}{'vs floor':>10}{'CPU s/GB':>10}"
             f"{'floor CPU s/GB':>16}{'CPU vs floor':>14}   (medians of pairs)"]
    fixed = [r for r in records if "variant" not in r]
    for fmt in dict.fromkeys(r["format"] for r in fixed):
        rs = [r for r in fixed if r["format"] == fmt]
        lines.append(f"{fmt:<10}{statistics.median(r['mb_per_s'] for r in rs):>12.0f}"
                     f"{statistics.median(r['floor_mb_per_s'] for r in rs):>12.0f}"
                     f"{statistics.median(r['vs_floor'] for r in rs):>10.2f}"
                     f"{statistics.median(r['cpu_s_per_gb'] for r in rs):>10.2f}"
                     f"{statistics.median(r['floor_cpu_s_per_gb'] for r in rs):>16.2f}"
                     f"{statistics.median(r['cpu_vs_floor'] for r in rs):>14.2f}")
    ragged = [r for r in records if "variant" in r]
    if ragged:
        lines.append(f"\n{'ragged store':<22}{'MB/s':>8}{'x fixed MB/s':>14}{'CPU s/GB':>10}{'CPU x fixed':>13}")
    for key in dict.fromkeys((r["format"], r["variant"]) for r in ragged):
        rs = [r for r in ragged if (r["format"], r["variant"]) == key]
        lines.append(f"{' '.join(key):<22}{statistics.median(r['mb_per_s'] for r in rs):>8.0f}"
                     f"{statistics.median(r['vs_fixed'] for r in rs):>14.2f}"
                     f"{statistics.median(r['cpu_s_per_gb'] for r in rs):>10.2f}"
                     f"{statistics.median(r['cpu_vs_fixed'] for r in rs):>13.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
