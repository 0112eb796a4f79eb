"""Object-storage I/O next to its native floor (``make bench-io``): JSON lines on stdout, a
summary table on stderr.

One dataset of volumes is converted to Parquet, Delta and HDF5 on local disk, then:

- **upload**: each store's files uploaded raw with the native client, and ``convert SRC URL``
  writing the same store straight onto the server: MB/s of the store's bytes;
- **floor**: raw ranged GETs of the store's data objects (8 MB ranges) with the native client,
  at 1, 8 and 32 requests in flight, CPU-seconds per GB of this process;
- **epoch**: ``open_store(URL, io_concurrency=N)`` and one shuffled epoch (2 workers), same
  concurrency, next to the floor in the same round (interleaved);
- **local**: one epoch of the store on local disk (the decode cost the floor does not pay);
- **cache**: at 8 in flight, epoch 1 filling a fresh ``cache_dir`` and epoch 2 from it.

Servers: Azurite (Azure Blob) and s3rver (S3, file-backed: its range GETs read only the range;
moto copies the whole object per range and cannot time a range reader), both on loopback,
both on this machine's cores: report CPU per GB, which carries over to a cloud VM, more than
MB/s, which is a share of what this machine does for client and server together.

    python -m trainfeed.benchmarks.micro.io_bench --count 1000 --rounds 2 > bench-out/io.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import trainfeed
from trainfeed.converters.storage.location import locate
from trainfeed.converters.storage.fetch import PART_SIZE
from trainfeed.converters.storage.filesystems import open_fs
from trainfeed.converters.formats.registry import FORMATS

from trainfeed.benchmarks.emulators import azurite, s3rver
from trainfeed.benchmarks.synth import generate_volumes

BUCKET = "bench"
STORE_NAMES = {"parquet": "store.parquet", "delta": "store.delta", "hdf5": "store.h5"}


class Meter:
    """Wall time and this process's CPU time (every thread, the native client's included)."""

    def __enter__(self) -> "Meter":
        self.wall, self.cpu, self.load = time.perf_counter(), time.process_time(), os.getloadavg()[0]
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu

    def record(self, nbytes: int, **fields) -> dict:
        return {**fields, "bytes": nbytes, "seconds": round(self.wall, 4), "mb_per_s": round(nbytes / self.wall / 1e6, 1),
                "cpu_s": round(self.cpu, 3), "cpu_s_per_gb": round(self.cpu / (nbytes / 1e9), 3),
                "load_1m": round(self.load, 2)}


def local_size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def floor_read(fs, objects: dict[str, int], concurrency: int) -> int:
    """Every object read as ``PART_SIZE`` ranges, ``concurrency`` in flight; the bytes read."""
    ranges = [(path, start, min(size, start + PART_SIZE)) for path, size in objects.items()
              for start in range(0, size, PART_SIZE)]
    with ThreadPoolExecutor(concurrency) as pool:
        return sum(pool.map(lambda r: len(fs.get_range(*r)), ranges))


def epoch(url: str, options: dict, workers: int, **kwargs) -> int:
    """One shuffled epoch; the number of samples read."""
    store = trainfeed.open_store(url, storage_options=options, **kwargs)
    return sum(len(b.ids) for b in store.batches(batch_size=32, shuffle=True, seed=1, workers=workers))


def run(args) -> list[dict]:
    records: list[dict] = []

    def emit(rec: dict) -> None:
        records.append(rec)
        print(json.dumps(rec), flush=True)

    work = Path(tempfile.mkdtemp(prefix="trainfeed-io-bench-"))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        src = work / "vols"
        generate_volumes(src, args.count, shape=args.shape, seed=0)
        local = {}
        for fmt in args.formats:
            local[fmt] = work / "local" / STORE_NAMES[fmt]
            local[fmt].parent.mkdir(exist_ok=True)
            trainfeed.convert(str(src), str(local[fmt]), format=fmt, labels=str(src / "labels.csv"))
        servers = {}
        if "azurite" in args.servers:
            server = stack.enter_context(azurite.start())
            server.create_container(BUCKET)
            servers["azurite"] = ("abfs", server.storage_options)
        if "s3rver" in args.servers:
            server = stack.enter_context(s3rver.start(BUCKET))
            servers["s3rver"] = ("s3", server.storage_options)
        for name, (scheme, options) in servers.items():
            fs, _ = open_fs(f"{scheme}://{BUCKET}", options)
            urls = {}
            for fmt in args.formats:
                nbytes = local_size(local[fmt])
                files = [local[fmt]] if local[fmt].is_file() else [f for f in local[fmt].rglob("*") if f.is_file()]
                with Meter() as m:
                    with ThreadPoolExecutor(4) as pool:
                        list(pool.map(lambda f: fs.put_file(str(f), f"{BUCKET}/raw-{fmt}/{f.relative_to(local[fmt].parent)}"),
                                      files))
                emit(m.record(nbytes, kind="upload", server=name, format=fmt))
                urls[fmt] = f"{scheme}://{BUCKET}/{STORE_NAMES[fmt]}"
                with Meter() as m:
                    trainfeed.convert(str(src), urls[fmt], format=fmt, labels=str(src / "labels.csv"),
                                      storage_options=options)
                emit(m.record(nbytes, kind="convert", server=name, format=fmt))
            for rnd in range(args.rounds):
                for fmt in args.formats:
                    url = urls[fmt]
                    data = FORMATS[fmt].data_files(locate(url, options))
                    objects = {p: fs.info(p)["size"] for p in data}
                    nbytes = sum(objects.values())
                    with Meter() as m:
                        epoch(str(local[fmt]), {}, args.workers)
                    emit(m.record(nbytes, kind="local", server=name, format=fmt, round=rnd))
                    for c in args.concurrency:
                        with Meter() as m:
                            assert floor_read(fs, objects, c) == nbytes
                        emit(m.record(nbytes, kind="floor", server=name, format=fmt, concurrency=c, round=rnd))
                        with Meter() as m:
                            assert epoch(url, options, args.workers, io_concurrency=c) == args.count
                        emit(m.record(nbytes, kind="epoch", server=name, format=fmt, concurrency=c, round=rnd))
                    cache = work / f"cache-{name}-{fmt}-{rnd}"
                    for e in (1, 2):
                        with Meter() as m:
                            epoch(url, options, args.workers, io_concurrency=8, cache_dir=str(cache))
                        emit(m.record(nbytes, kind=f"cache_epoch{e}", server=name, format=fmt, concurrency=8,
                                      round=rnd))
                    shutil.rmtree(cache, ignore_errors=True)
    return records


def summary(records: list[dict]) -> str:
    def med(kind: str, key: str, **match) -> float | None:
        vals = [r[key] for r in records if r["kind"] == kind and all(r.get(k) == v for k, v in match.items())]
        return statistics.median(vals) if vals else None

    lines = ["server   format  in flight | floor MB/s  trainfeed MB/s  ratio | CPU-s/GB floor  local  trainfeed  "
             "x(floor+local)",
             "-" * 112]
    keys = sorted({(r["server"], r["format"], r["concurrency"]) for r in records if r["kind"] == "epoch"})
    for server, fmt, c in keys:
        f_mb, e_mb = med("floor", "mb_per_s", server=server, format=fmt, concurrency=c), \
            med("epoch", "mb_per_s", server=server, format=fmt, concurrency=c)
        f_cpu, e_cpu = med("floor", "cpu_s_per_gb", server=server, format=fmt, concurrency=c), \
            med("epoch", "cpu_s_per_gb", server=server, format=fmt, concurrency=c)
        l_cpu = med("local", "cpu_s_per_gb", server=server, format=fmt)
        lines.append(f"{server:8} {fmt:7} {c:9} | {f_mb:10.0f} {e_mb:15.0f} {e_mb / f_mb:6.2f} | {f_cpu:14.2f} "
                     f"{l_cpu:6.2f} {e_cpu:10.2f} {e_cpu / (f_cpu + l_cpu):15.2f}")
    lines += ["", "server   format  | local MB/s  cache epoch 1  cache epoch 2  epoch2/local | raw upload MB/s  "
              "convert MB/s  ratio", "-" * 112]
    for server, fmt in sorted({(r["server"], r["format"]) for r in records if r["kind"] == "local"}):
        loc = med("local", "mb_per_s", server=server, format=fmt)
        c1, c2 = med("cache_epoch1", "mb_per_s", server=server, format=fmt), \
            med("cache_epoch2", "mb_per_s", server=server, format=fmt)
        up, conv = med("upload", "mb_per_s", server=server, format=fmt), med("convert", "mb_per_s", server=server,
                                                                               format=fmt)
        lines.append(f"{server:8} {fmt:7} | {loc:10.0f} {c1:14.0f} {c2:14.0f} {c2 / loc:13.2f} | {up:15.0f} "
                     f"{conv:13.0f} {conv / up:6.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trainfeed.benchmarks.micro.io_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=1000, help="volumes in the dataset (default 1000: 360 MB)")
    parser.add_argument("--shape", default="30x30x10x10", help="shape of one float32 volume (default 30x30x10x10)")
    parser.add_argument("--formats", default="parquet,delta,hdf5")
    parser.add_argument("--servers", default="azurite,s3rver")
    parser.add_argument("--concurrency", default="1,8,32", help="requests in flight (default 1,8,32)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    parser.add_argument("--workers", type=int, default=2, help="the reader's decode workers (default 2)")
    args = parser.parse_args(argv)
    args.shape = tuple(int(x) for x in args.shape.split("x"))
    args.formats = args.formats.split(",")
    args.servers = args.servers.split(",")
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    records = run(args)
    print(summary(records), file=sys.stderr)


if __name__ == "__main__":
    main()
