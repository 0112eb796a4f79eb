"""Conversion throughput next to the raw cost of the same bytes, measured in one run.

raw: read every source file and write the same bytes to one file (N threads reading), the
floor any converter pays. convert: the real ``convert`` into each format. Rounds interleave
the cases so machine noise hits all of them alike; the page cache is warm for every case
(the dataset is read once before the first round). Results go to JSON lines.

    python -m benchmarks.convert_bench --out bench-out/convert.jsonl [--gb 1.0]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from converters.convert import ConvertConfig, convert
from converters.options import WriteOptions

from .synth import VOLUME_SHAPE, generate_volumes

CASES = [
    ("parquet", "snappy"), ("parquet", "none"), ("delta", "snappy"), ("hdf5", "none"),
]


def raw_copy(files: list[Path], dst: Path, workers: int) -> tuple[float, int]:
    """Read every file (``workers`` threads) and append its bytes to ``dst``."""
    t0 = time.perf_counter()
    total = 0
    with open(dst, "wb") as out, ThreadPoolExecutor(workers) as pool:
        for data in pool.map(Path.read_bytes, files):
            out.write(data)
            total += len(data)
    return time.perf_counter() - t0, total


def ensure_dataset(root: Path, gb: float, seed: int = 0) -> Path:
    sample = int(__import__("numpy").prod(VOLUME_SHAPE)) * 4
    count = int(gb * 1e9 / sample) + 1
    src = root / f"volumes-{count}"
    if not (src / "labels.csv").exists():
        shutil.rmtree(src, ignore_errors=True)
        generate_volumes(src, count, seed=seed)
    return src


def environment() -> dict:
    import numpy
    import pyarrow

    import deltalake
    import h5py

    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version(), "pyarrow": pyarrow.__version__, "numpy": numpy.__version__,
            "deltalake": deltalake.__version__, "h5py": h5py.__version__, "page_cache": "warm"}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench-out/convert.jsonl")
    ap.add_argument("--work", default="bench-out/work", help="where the dataset and outputs go")
    ap.add_argument("--gb", type=float, default=1.0, help="dataset size in GB (10^9 bytes)")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    src = ensure_dataset(work, args.gb)
    files = sorted(src.glob("*.npy"))
    raw_copy(files, work / "warmup.bin", 2)  # warm the page cache for every case alike
    worker_counts = [int(w) for w in args.workers.split(",")]
    env = environment()
    records = []
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "a") as out:
        for rep in range(args.repeats):
            for workers in worker_counts:
                seconds, nbytes = raw_copy(files, work / "raw.bin", workers)
                records.append({"case": "raw", "workers": workers, "repeat": rep, "seconds": seconds, "bytes": nbytes})
                for fmt, comp in CASES:
                    dst = work / f"out-{fmt}-{comp}"
                    shutil.rmtree(dst, ignore_errors=True)
                    cfg = ConvertConfig(src=str(src), dst=str(dst), fmt=fmt, labels_csv=str(src / "labels.csv"),
                                        workers=workers, write=WriteOptions(compression=comp))
                    summary = convert(cfg)
                    records.append({"case": f"{fmt}-{comp}", "workers": workers, "repeat": rep,
                                    "seconds": summary["seconds"], "bytes": summary["bytes_in"],
                                    "files_out": summary["files_out"], "bytes_out": summary["bytes_out"]})
                    shutil.rmtree(dst, ignore_errors=True)
                for r in records[-(len(CASES) + 1):]:
                    r.update(mb_per_s=r["bytes"] / r["seconds"] / 1e6, files_in=len(files), env=env)
                    out.write(json.dumps({"bench": "convert", **r}) + "\n")
                    out.flush()
    (work / "raw.bin").unlink(missing_ok=True)
    (work / "warmup.bin").unlink(missing_ok=True)
    print(summarize(records))


def summarize(records: list[dict]) -> str:
    """Median MB/s per case and workers, and its ratio to raw at the same worker count."""
    med = {}
    for r in records:
        med.setdefault((r["case"], r["workers"]), []).append(r["bytes"] / r["seconds"] / 1e6)
    med = {k: statistics.median(v) for k, v in med.items()}
    lines = [f"{'case':<16}{'workers':>8}{'MB/s':>10}{'vs raw':>9}"]
    for (case, workers), rate in sorted(med.items(), key=lambda kv: (kv[0][1], kv[0][0] != "raw", kv[0][0])):
        lines.append(f"{case:<16}{workers:>8}{rate:>10.0f}{rate / med[('raw', workers)]:>9.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
