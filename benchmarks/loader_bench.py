"""Ingest-only throughput of every reader on the same >= 1 GB dataset, next to the raw
limit measured in the same run: reading the same Parquet files into Arrow memory with
pyarrow, no decoding beyond it. No model: this is the "ingest-only" leg of the
differential stall analysis.

    python -m trainfeed.benchmarks.loader_bench --out bench-out/loader.jsonl [--gb 1.0]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import pyarrow.parquet as pq

from trainfeed.converters.convert import ConvertConfig, convert
from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.options import WriteOptions
from trainfeed.training.readers import ReaderOptions, iter_batches, open_store

from trainfeed.training.metrics import environment

from .convert_bench import ensure_dataset

MB = 10**6


def build_stores(src: Path, work: Path) -> dict[str, Path]:
    """The layouts compared (cached across runs): Parquet at three row-group sizes, a list
    column, Delta and HDF5 — all uncompressed, from the same source."""
    variants = {
        "parquet-rg8MB": ("parquet", WriteOptions(row_group_size=8 * MB)),
        "parquet-rg32MB": ("parquet", WriteOptions(row_group_size=32 * MB)),
        "parquet-rg128MB": ("parquet", WriteOptions(row_group_size=128 * MB, target_file_size=256 * MB)),
        "parquet-list-rg32MB": ("parquet", WriteOptions(row_group_size=32 * MB, tensor_column="list")),
        "delta-rg32MB": ("delta", WriteOptions(row_group_size=32 * MB)),
        "hdf5": ("hdf5", WriteOptions()),
    }
    out = {}
    for name, (fmt, opts) in variants.items():
        dst = work / f"store-{name}"
        if not dst.exists():
            convert(ConvertConfig(src=str(src), dst=str(dst), fmt=fmt, write=opts, labels_csv=str(src / "labels.csv")))
        out[name] = dst
    out["blob"] = src
    return out


def raw_limit(store: Path) -> tuple[float, int]:
    """Seconds to read every Parquet file of ``store`` into Arrow memory (pyarrow's own threads)."""
    from trainfeed.converters import parquet

    files = parquet.data_files(store)
    t0 = time.perf_counter()
    rows = sum(pq.read_table(f).num_rows for f in files)
    return time.perf_counter() - t0, rows


def ingest(store_path: Path, opts: ReaderOptions, fmt: str | None = None) -> tuple[float, int, int]:
    store = open_store(str(store_path), fmt, opts)
    t0 = time.perf_counter()
    samples = nbytes = 0
    for batch in iter_batches(store, opts):
        samples += len(batch.ids)
        nbytes += batch.nbytes
    return time.perf_counter() - t0, samples, nbytes


def cases(stores: dict[str, Path], src: Path) -> list[tuple[str, Path, ReaderOptions, str | None]]:
    labels = str(src / "labels.csv")
    base = dict(batch_size=32, shuffle=True, shuffle_buffer=256, drop_last=False)
    out = []
    for pool in ("sharded", "process", "thread", "dummy"):
        for workers in ((1, 2, 4) if pool != "dummy" else (1,)):
            out.append((f"petastorm-{pool}-w{workers} rg32MB", stores["parquet-rg32MB"],
                        ReaderOptions(pool=pool, workers=workers, **base), None))
    for workers in (1, 2, 4):
        out.append((f"arrow (no petastorm)-w{workers} rg32MB", stores["parquet-rg32MB"],
                    ReaderOptions(pool="arrow", workers=workers, **base), None))
    for rg in ("rg8MB", "rg128MB"):
        out.append((f"petastorm-sharded-w2 {rg}", stores[f"parquet-{rg}"], ReaderOptions(pool="sharded", workers=2, **base), None))
    out.append(("petastorm-sharded-w2 list-rg32MB", stores["parquet-list-rg32MB"],
                ReaderOptions(pool="sharded", workers=2, **base), None))
    out.append(("delta petastorm-sharded-w2", stores["delta-rg32MB"], ReaderOptions(pool="sharded", workers=2, **base), None))
    for workers in (1, 2):
        out.append((f"hdf5-w{workers}", stores["hdf5"], ReaderOptions(workers=workers, **base), None))
    for workers in (4, 16):
        out.append((f"blob-local-w{workers}", stores["blob"], ReaderOptions(workers=workers, labels_csv=labels, **base), "blob"))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench-out/loader.jsonl")
    ap.add_argument("--work", default="bench-out/work")
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    src = ensure_dataset(work, args.gb)
    stores = build_stores(src, work)
    env = {**environment(), "page_cache": "warm (every store read once before timing)"}
    for path in stores.values():  # warm the page cache for every layout alike
        for f in path.rglob("*"):
            if f.is_file():
                f.read_bytes()
    records = []
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as out:
        for rep in range(args.repeats):
            for name, path, opts, fmt in cases(stores, src):
                # the raw limit is measured right before each case: ratios per pair, noise shared
                raw_s, rows = raw_limit(stores["parquet-rg32MB"])
                raw_rate = rows * 360_000 / raw_s / MB
                rec = {"bench": "loader", "case": name, "repeat": rep, "raw_limit_mb_per_s": raw_rate, "env": env}
                try:
                    seconds, samples, nbytes = ingest(path, opts, fmt)
                    rec.update(seconds=seconds, samples=samples, mb_per_s=nbytes / seconds / MB,
                               samples_per_s=samples / seconds, vs_raw=(nbytes / seconds / MB) / raw_rate)
                except TrainfeedError as exc:
                    rec.update(error=str(exc))
                records.append(rec)
                out.write(json.dumps(rec) + "\n")
                out.flush()
        na = {"bench": "loader", "case": "petastorm make_reader", "skipped": (
            "make_reader needs a Petastorm dataset (Unischema metadata written by materialize_dataset on Spark) "
            "and unpickles that metadata; trainfeed stores are plain Parquet with JSON metadata, read with "
            "make_batch_reader")}
        out.write(json.dumps(na) + "\n")
    print(summarize(records))


def summarize(records: list[dict]) -> str:
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(r["case"], []).append(r)
    raw = statistics.median(r["raw_limit_mb_per_s"] for r in records)
    lines = [f"raw limit (pyarrow read of the rg32MB Parquet files, median of all pairs): {raw:.0f} MB/s",
             f"{'case':<36}{'MB/s':>8}{'samples/s':>11}{'vs raw (per-pair median)':>26}"]
    for case, rs in groups.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            lines.append(f"{case:<36}  failed: {rs[0]['error'][:60]}")
            continue
        note = f"  ({len(rs) - len(ok)} of {len(rs)} runs stopped: rows dropped)" if len(ok) < len(rs) else ""
        lines.append(f"{case:<36}{statistics.median(r['mb_per_s'] for r in ok):>8.0f}"
                     f"{statistics.median(r['samples_per_s'] for r in ok):>11.0f}"
                     f"{statistics.median(r['vs_raw'] for r in ok):>26.2f}{note}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
