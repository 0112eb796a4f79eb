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
- **cache**: at 8 in flight, epoch 1 filling a fresh ``cache_dir`` and epoch 2 from it;
- **dataloader** (``loader_rows.py``): what most PyTorch users run, ``DataLoader(TorchDataset(store),
  num_workers=N)`` with persistent workers, epochs 1 and 2, next to ``num_workers=0`` (trainfeed's
  threads), without and with a ``cache_dir``, on the warm local store and on each server;
  CPU counts the training process and its worker processes.

- **peer** (s3rver, when ``s3torchconnector`` is installed: ``pip install s3torchconnector``):
  AWS's connector for PyTorch over the same volumes as one object each (how an S3 user would
  keep them for it), its map-style and iterable datasets through the same DataLoader workers.
- **lance** (s3rver, when ``pylance`` is installed): the same samples as a Lance dataset on the
  same server (written from the Parquet store's table), one epoch of ``to_batches`` at Lance's
  own batch size, each batch's volumes as one float32 array cut into batches of 32: a sequential
  scan, where trainfeed's epoch is shuffled, so the comparison favours Lance.

Each server is measured as it answers (0 ms) and behind a relay that adds ``--latency-ms`` to
every request (what a cloud region adds), the floor remeasured behind the same relay.

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
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import trainfeed
from trainfeed.benchmarks.ab.hostload import ProcessesCPU
from trainfeed.benchmarks.emulators import azurite, s3rver
from trainfeed.benchmarks.emulators.latency import LatencyRelay
from trainfeed.benchmarks.micro import io_summary, loader_rows
from trainfeed.benchmarks.synth import generate_volumes
from trainfeed.converters.formats.registry import FORMATS
from trainfeed.converters.storage.cache_writer import flush_cache_writes
from trainfeed.converters.storage.fetch import PART_SIZE
from trainfeed.converters.storage.filesystems import open_fs
from trainfeed.converters.storage.location import locate
from trainfeed.converters.storage.native import NativeFileSystem

BUCKET = "bench"
STORE_NAMES = {"parquet": "store.parquet", "delta": "store.delta", "hdf5": "store.h5"}


class Meter:
    """Wall time and this process's CPU time (every thread, the native client's included)."""

    def __enter__(self) -> Meter:
        self.wall, self.cpu, self.load = time.perf_counter(), time.process_time(), os.getloadavg()[0]
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu

    def record(self, nbytes: int, **fields: Any) -> dict[str, Any]:
        return {**fields, "bytes": nbytes, "seconds": round(self.wall, 4),
                "mb_per_s": round(nbytes / self.wall / 1e6, 1),
                "cpu_s": round(self.cpu, 3), "cpu_s_per_gb": round(self.cpu / (nbytes / 1e9), 3),
                "load_1m": round(self.load, 2)}


def local_size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def floor_read(fs: NativeFileSystem, objects: dict[str, int], concurrency: int) -> int:
    """Every object read as ``PART_SIZE`` ranges, ``concurrency`` in flight; the bytes read."""
    ranges = [(path, start, min(size, start + PART_SIZE)) for path, size in objects.items()
              for start in range(0, size, PART_SIZE)]
    with ThreadPoolExecutor(concurrency) as pool:
        return sum(pool.map(lambda r: len(fs.get_range(*r)), ranges))


def epoch(url: str, options: dict[str, Any], workers: int, lanes: int | None = None, **kwargs: Any) -> int:
    """One shuffled epoch (``lanes``: as ``store.batches`` takes it); the number of samples read."""
    store = trainfeed.open_store(url, storage_options=options, **kwargs)
    return sum(len(b.ids) for b in store.batches(batch_size=32, shuffle=True, seed=1, workers=workers, lanes=lanes))


def _volume(reader: Any) -> object:  # s3torchconnector ships no types
    """An s3torchconnector item (a readable object) as the tensor it holds."""
    import io

    import numpy as np
    import torch

    return torch.from_numpy(np.load(io.BytesIO(reader.read())))


def peer_epoch(kind: str, prefix_url: str, options: dict[str, Any], method: str, workers: int) -> tuple[int, int,
               float]:
    """One epoch of AWS's s3torchconnector (``kind``: map or iterable) over the objects under
    ``prefix_url`` through a DataLoader: (samples, bytes, CPU-seconds of the worker processes)."""
    import s3torchconnector as s3t
    from torch.utils.data import DataLoader

    config = s3t.S3ClientConfig(force_path_style=True)
    common = dict(region=options["region_name"], endpoint=options["endpoint_url"], transform=_volume,
                  s3client_config=config)
    dataset = (s3t.S3MapDataset.from_prefix(prefix_url, **common) if kind == "map" else
               s3t.S3IterableDataset.from_prefix(prefix_url, enable_sharding=True, **common))
    loader = DataLoader(dataset, batch_size=32, num_workers=workers, multiprocessing_context=method, timeout=600,
                        shuffle=kind == "map")
    workers_cpu = ProcessesCPU()
    before = workers_cpu.children()
    samples = nbytes = 0
    for x in loader:
        samples, nbytes = samples + len(x), nbytes + x.numel() * x.element_size()
        workers_cpu.children()  # a worker that exits keeps its last reading
    return samples, nbytes, workers_cpu.children() - before


def relayed(options: dict[str, Any], server_port: int, relay_port: int) -> dict[str, Any]:
    """The storage options with the server's port replaced by the relay's."""
    return {k: v.replace(f":{server_port}", f":{relay_port}") if isinstance(v, str) else v
            for k, v in options.items()}


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []

    def emit(rec: dict[str, Any]) -> None:
        records.append(rec)
        print(json.dumps(rec), flush=True)

    if args.loader_formats:
        import torch.utils.data  # imported before any cell is timed  # noqa: F401
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
        for rnd in range(args.rounds):  # the DataLoader on the warm local store
            for fmt in args.loader_formats:
                for rec in loader_rows.rows(str(local[fmt]), {}, args.count, work, tuple(args.methods),
                                            tuple(args.loader_workers)):
                    emit({**rec, "server": "local", "latency_ms": 0, "format": fmt, "round": rnd})
        servers = {}
        if "azurite" in args.servers:
            blob_server = stack.enter_context(azurite.start())
            blob_server.create_container(BUCKET)
            servers["azurite"] = ("abfs", blob_server.storage_options, blob_server.port)
        if "s3rver" in args.servers:
            s3_server = stack.enter_context(s3rver.start(BUCKET))
            servers["s3rver"] = ("s3", s3_server.storage_options, s3_server.port)
            # the peer takes its credentials from the environment, in every worker process (also
            # those of a forkserver started before it runs)
            os.environ["AWS_ACCESS_KEY_ID"] = os.environ["AWS_SECRET_ACCESS_KEY"] = s3rver.ACCESS_KEY
        for name, (scheme, options, port) in servers.items():
            fs, _ = open_fs(f"{scheme}://{BUCKET}", options)
            urls = {}
            for fmt in args.formats:
                nbytes = local_size(local[fmt])
                files = [local[fmt]] if local[fmt].is_file() else [f for f in local[fmt].rglob("*") if f.is_file()]
                with Meter() as m, ThreadPoolExecutor(4) as pool:
                    list(pool.map(lambda f, fs=fs, fmt=fmt:
                                  fs.put_file(str(f), f"{BUCKET}/raw-{fmt}/{f.relative_to(local[fmt].parent)}"),
                                  files))
                emit(m.record(nbytes, kind="upload", server=name, format=fmt))
                urls[fmt] = f"{scheme}://{BUCKET}/{STORE_NAMES[fmt]}"
                with Meter() as m:
                    trainfeed.convert(str(src), urls[fmt], format=fmt, labels=str(src / "labels.csv"),
                                      storage_options=options)
                emit(m.record(nbytes, kind="convert", server=name, format=fmt))
            if scheme == "s3":  # the volumes as one object each, for the peer
                with ThreadPoolExecutor(8) as pool:
                    list(pool.map(lambda f, fs=fs: fs.put_file(str(f), f"{BUCKET}/objects/{f.name}"),
                                  sorted(src.glob("*.npy"))))
                if _has_lance() and "parquet" in local:
                    write_lance(local["parquet"], options)
            for latency in args.latency_ms:
                if latency:
                    relay = stack.enter_context(LatencyRelay(port, latency / 1000))
                    measure(args, name, scheme, relayed(options, port, relay.port), urls, local, work, emit,
                            latency)
                else:
                    measure(args, name, scheme, options, urls, local, work, emit, latency)
    return records


def measure(args: argparse.Namespace, name: str, scheme: str, options: dict[str, Any], urls: dict[str, Any],
            local: dict[str, Any], work: Path, emit: Callable[[dict[str, Any]], None], latency: int) -> None:
    """The rounds on one server, as reached through ``options`` (directly or through a relay)."""
    fs, _ = open_fs(f"{scheme}://{BUCKET}", options)
    server = {"server": name, "latency_ms": latency}
    for rnd in range(args.rounds):
        for fmt in args.formats:
            if latency and fmt == "delta":
                continue  # delta-rs's own requests (reading the log) hang behind the relay: not measured
            url = urls[fmt]
            data = FORMATS[fmt].data_files(locate(url, options))
            objects = {p: fs.info(p)["size"] for p in data}
            nbytes = sum(objects.values())
            with Meter() as m:
                epoch(str(local[fmt]), {}, args.workers)
            emit(m.record(nbytes, kind="local", **server, format=fmt, round=rnd))
            for c in args.concurrency:
                with Meter() as m:
                    assert floor_read(fs, objects, c) == nbytes
                emit(m.record(nbytes, kind="floor", **server, format=fmt, concurrency=c, round=rnd))
                with Meter() as m:
                    assert epoch(url, options, args.workers, io_concurrency=c) == args.count
                emit(m.record(nbytes, kind="epoch", **server, format=fmt, concurrency=c, round=rnd))
                if c == 8:  # one lane: the order before lanes (one shuffle window at a time), side by side
                    with Meter() as m:
                        assert epoch(url, options, args.workers, lanes=1, io_concurrency=c) == args.count
                    emit(m.record(nbytes, kind="epoch_one_lane", **server, format=fmt, concurrency=c, round=rnd))
            cache = work / f"cache-{name}-{latency}-{fmt}-{rnd}"
            for e in (1, 2):
                with Meter() as m:
                    epoch(url, options, args.workers, io_concurrency=8, cache_dir=str(cache))
                emit(m.record(nbytes, kind=f"cache_epoch{e}", **server, format=fmt, concurrency=8,
                              round=rnd))
            flush_cache_writes()  # the writes still queued, before their folder goes
            shutil.rmtree(cache, ignore_errors=True)
            if fmt in args.loader_formats:
                for rec in loader_rows.rows(url, options, args.count, work, tuple(args.methods),
                                            tuple(args.loader_workers)):
                    emit({**rec, **server, "format": fmt, "round": rnd})
                for rec in loader_rows.rank_rows(url, options):
                    emit({**rec, **server, "format": fmt, "round": rnd})
        if scheme == "s3" and _has_lance():
            with Meter() as m:
                got, lance_bytes = lance_epoch(options, args.shape)
            assert got == args.count
            emit(m.record(lance_bytes, kind="lance", **server, format="lance", round=rnd))
            for rec in loader_rows.lance_rows(LANCE_URL, lance_options(options), args.shape, args.count):
                emit({**rec, **server, "format": "lance", "round": rnd})
        if scheme != "s3" or not _has_peer():
            continue  # the peer reads S3 only
        workers = loader_rows.OTHER_METHODS_WORKERS  # the peer reads in worker processes
        for method in args.methods:
            for kind in ("map", "iterable"):
                with Meter() as m:
                    got, peer_bytes, worker_cpu = peer_epoch(kind, f"s3://{BUCKET}/objects/", options, method,
                                                             workers)
                assert got == args.count
                m.cpu += worker_cpu
                emit(m.record(peer_bytes, kind=f"s3torch_{kind}", **server, format="objects", method=method,
                              workers=workers, round=rnd))


def _has_peer() -> bool:
    try:
        import s3torchconnector  # noqa: F401
    except ImportError:
        return False
    return True


def _has_lance() -> bool:
    try:
        import lance  # noqa: F401
    except ImportError:
        return False
    return True


LANCE_URL = f"s3://{BUCKET}/store.lance"


def lance_options(options: dict[str, Any]) -> dict[str, Any]:
    """The S3 server's storage options (fsspec's names) as Lance's (object_store's)."""
    return {"aws_access_key_id": options["key"], "aws_secret_access_key": options["secret"],
            "aws_endpoint": options["endpoint_url"], "aws_region": options.get("region_name", "us-east-1"),
            "allow_http": "true"}


def write_lance(parquet_store: Path, options: dict[str, Any]) -> None:
    """The Parquet store's rows (id, label, the volume's bytes) as a Lance dataset on the server."""
    import lance
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(parquet_store.rglob("*.parquet")) if parquet_store.is_dir() else [parquet_store]
    table = pa.concat_tables([pq.read_table(f) for f in files]).replace_schema_metadata(None)
    lance.write_dataset(table, LANCE_URL, storage_options=lance_options(options), mode="overwrite")


def lance_epoch(options: dict[str, Any], shape: tuple[int, ...]) -> tuple[int, int]:
    """One epoch of the Lance dataset, in order, each batch's volumes as one float32 array: the
    samples and the bytes of its data files."""
    import lance
    import numpy as np

    ds = lance.dataset(LANCE_URL, storage_options=lance_options(options))
    samples = 0
    for batch in ds.to_batches(columns=["id", "label", "volume"]):  # Lance's own batch size, then 32 at a time
        column = batch.column("volume")
        x = np.frombuffer(column.buffers()[2], np.float32)[:len(column) * int(np.prod(shape))].reshape(-1, *shape)
        samples += sum(len(x[i:i + 32]) for i in range(0, len(x), 32))
    nbytes = sum(f.file_size_bytes or 0 for fr in ds.get_fragments() for f in fr.data_files())
    return samples, nbytes


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
    parser.add_argument("--latency-ms", default="0,20", help="latency added to every request, per pass (default 0,20)")
    parser.add_argument("--methods", default="fork,forkserver,spawn", help="DataLoader start methods")
    parser.add_argument("--loader-workers", default="1,2,4",
                        help="DataLoader worker processes under fork (default 1,2,4), beside num_workers=0 "
                             "(trainfeed's threads in the training process) and 2 under each other start method")
    parser.add_argument("--loader-formats", default="parquet", help="formats read through DataLoader (default parquet)")
    args = parser.parse_args(argv)
    args.shape = tuple(int(x) for x in args.shape.split("x"))
    args.formats = args.formats.split(",")
    args.servers = args.servers.split(",")
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.latency_ms = [int(v) for v in args.latency_ms.split(",")]
    args.methods = [m for m in args.methods.split(",") if m]
    args.loader_workers = [int(w) for w in args.loader_workers.split(",") if w]
    args.loader_formats = [f for f in args.loader_formats.split(",") if f]
    records = run(args)
    print(io_summary.summary(records), file=sys.stderr)


if __name__ == "__main__":
    main()
