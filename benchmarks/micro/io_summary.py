"""The tables ``make bench-io`` prints on stderr, from its JSON lines (medians over rounds)."""
from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from trainfeed.benchmarks.micro import loader_rows


def summary(records: list[dict[str, Any]]) -> str:
    def med(kind: str, key: str, **match: Any) -> float:
        vals = [r[key] for r in records if r["kind"] == kind and all(r.get(k) == v for k, v in match.items())]
        return statistics.median(vals) if vals else float("nan")

    lines = ["server   +ms format  in flight | floor MB/s  trainfeed MB/s  ratio | CPU-s/GB floor  local  trainfeed  "
             "x floor", "-" * 112]
    for server, lat, fmt, c in sorted({(r["server"], r["latency_ms"], r["format"], r["concurrency"])
                                       for r in records if r["kind"] == "epoch"}):
        at = dict(server=server, latency_ms=lat, format=fmt)
        f_mb, e_mb = med("floor", "mb_per_s", **at, concurrency=c), med("epoch", "mb_per_s", **at, concurrency=c)
        f_cpu, e_cpu = med("floor", "cpu_s_per_gb", **at, concurrency=c), med("epoch", "cpu_s_per_gb", **at,
                                                                              concurrency=c)
        l_cpu = med("local", "cpu_s_per_gb", **at)
        lines.append(f"{server:8} {lat:3} {fmt:7} {c:9} | {f_mb:10.0f} {e_mb:15.0f} {e_mb / f_mb:6.2f} | "
                     f"{f_cpu:14.2f} {l_cpu:6.2f} {e_cpu:10.2f} {e_cpu / f_cpu:8.2f}")
    one_lane = sorted({(r["server"], r["latency_ms"], r["format"]) for r in records if r["kind"] == "epoch_one_lane"})
    if one_lane:
        lines += ["", "store.batches at 8 in flight, default lanes next to one lane (the order before lanes)",
                  "server   +ms format  | MB/s lanes  one lane  ratio | CPU/GB lanes  one lane  ratio", "-" * 112]
        for server, lat, fmt in one_lane:
            at = dict(server=server, latency_ms=lat, format=fmt, concurrency=8)
            a, b = med("epoch", "mb_per_s", **at), med("epoch_one_lane", "mb_per_s", **at)
            ca, cb = med("epoch", "cpu_s_per_gb", **at), med("epoch_one_lane", "cpu_s_per_gb", **at)
            lines.append(f"{server:8} {lat:3} {fmt:7} | {a:10.0f} {b:9.0f} {a / b:6.2f} | {ca:12.2f} {cb:9.2f} "
                         f"{ca / cb:6.2f}")
    lines += ["", "server   +ms format  | local MB/s  no cache  cache epoch 1  epoch1 cache/none  cache epoch 2",
              "-" * 112]
    for server, lat, fmt in sorted({(r["server"], r["latency_ms"], r["format"]) for r in records
                                    if r["kind"] == "local"}):
        at = dict(server=server, latency_ms=lat, format=fmt)
        none, c1, c2 = (med("epoch", "mb_per_s", **at, concurrency=8), med("cache_epoch1", "mb_per_s", **at),
                        med("cache_epoch2", "mb_per_s", **at))
        lines.append(f"{server:8} {lat:3} {fmt:7} | {med('local', 'mb_per_s', **at):10.0f} {none:9.0f} {c1:14.0f} "
                     f"{c1 / none:18.2f} {c2:14.0f}")
    lines += loader_summary(records, med)
    ranks = sorted({(r["server"], r["latency_ms"], r["format"]) for r in records if r["kind"] == "ranks"})
    if ranks:
        lines += ["", "Ranks on this machine, each reading its part of every global batch: aggregate MB/s and "
                  "CPU-s/GB, 2 ranks over 1", "server   +ms format  | 1 rank ep1  ep2 | 2 ranks ep1  ep2 | x1 ep1  "
                  "ep2", "-" * 112]
        for server, lat, fmt in ranks:
            at = dict(server=server, latency_ms=lat, format=fmt)
            one = [med("ranks", "mb_per_s", **at, world=1, epoch=e) for e in (1, 2)]
            two = [med("ranks", "mb_per_s", **at, world=2, epoch=e) for e in (1, 2)]
            lines.append(f"{server:8} {lat:3} {fmt:7} | {one[0]:10.0f} {one[1]:4.0f} | {two[0]:11.0f} {two[1]:4.0f} "
                         f"| {two[0] / one[0]:6.2f} {two[1] / one[1]:4.2f}")
    peers = sorted({(r["server"], r["latency_ms"], r["method"], r["workers"]) for r in records
                    if r["kind"].startswith("s3torch_")})
    if peers:
        lines += ["", "AWS s3torchconnector (one object a volume) next to trainfeed's DataLoader (Parquet), same "
                  "workers", "server   +ms method     W | map MB/s  iterable MB/s  trainfeed MB/s | CPU/GB map  "
                  "iterable  trainfeed", "-" * 112]
        for server, lat, method, w in peers:
            at = dict(server=server, latency_ms=lat, method=method, workers=w)
            ours = dict(at, format="parquet", kind="workers", epoch=1)
            lines.append(f"{server:8} {lat:3} {method:10} {w} | {med('s3torch_map', 'mb_per_s', **at):8.0f} "
                         f"{med('s3torch_iterable', 'mb_per_s', **at):14.0f} "
                         f"{med('workers', 'mb_per_s', **ours):15.0f}"
                         f" | {med('s3torch_map', 'cpu_s_per_gb', **at):10.2f} "
                         f"{med('s3torch_iterable', 'cpu_s_per_gb', **at):9.2f} "
                         f"{med('workers', 'cpu_s_per_gb', **ours):10.2f}")
    lance_loaders = sorted({(r["server"], r["latency_ms"]) for r in records if r["kind"] == "lance_loader"})
    if lance_loaders:
        lines += ["", "Through a DataLoader (each a fresh process): Lance's LanceDataset at its best num_workers next "
                  "to trainfeed's TorchDataset through 2 workers (fork)", "server   +ms epoch | Lance MB/s (W)  "
                  "trainfeed  x Lance | CPU/GB Lance  trainfeed", "-" * 112]
        pair = loader_rows.OTHER_METHODS_WORKERS
        for server, lat in lance_loaders:
            at = dict(server=server, latency_ms=lat)
            for e in (1, 2):
                best = max((0, pair), key=lambda w: med("lance_loader", "mb_per_s", **at, workers=w, epoch=e))
                l_mb, l_cpu = (med("lance_loader", k, **at, workers=best, epoch=e)
                               for k in ("mb_per_s", "cpu_s_per_gb"))
                ours = dict(at, format="parquet", method="fork", workers=pair, epoch=e)
                t_mb, t_cpu = med("workers", "mb_per_s", **ours), med("workers", "cpu_s_per_gb", **ours)
                lines.append(f"{server:8} {lat:3} {e:5} | {l_mb:10.0f} ({best}) {t_mb:10.0f} {t_mb / l_mb:8.2f} | "
                             f"{l_cpu:12.2f} {t_cpu:10.2f}")
    lance_rows = sorted({(r["server"], r["latency_ms"]) for r in records if r["kind"] == "lance"})
    if lance_rows:
        lines += ["", "Lance (to_batches, in order) next to trainfeed's shuffled epoch (Parquet, 8 in flight)",
                  "server   +ms | Lance MB/s  trainfeed  x Lance  cache ep1  x Lance | CPU/GB Lance  trainfeed  "
                  "x Lance",
                  "-" * 112]
        for server, lat in lance_rows:
            at = dict(server=server, latency_ms=lat)
            l_mb, l_cpu = med("lance", "mb_per_s", **at), med("lance", "cpu_s_per_gb", **at)
            e_mb = med("epoch", "mb_per_s", **at, format="parquet", concurrency=8)
            e_cpu = med("epoch", "cpu_s_per_gb", **at, format="parquet", concurrency=8)
            c_mb = med("cache_epoch1", "mb_per_s", **at, format="parquet")
            lines.append(f"{server:8} {lat:3} | {l_mb:10.0f} {e_mb:10.0f} {e_mb / l_mb:8.2f} {c_mb:10.0f} "
                         f"{c_mb / l_mb:8.2f} | {l_cpu:12.2f} {e_cpu:10.2f} {e_cpu / l_cpu:8.2f}")
    return "\n".join(lines)


def loader_summary(records: list[dict[str, Any]], med: Callable[..., float]) -> list[str]:
    """The DataLoader rows: each cell's MB/s and CPU-s/GB, and their ratios to num_workers=0 (the
    same epoch, server and latency); with a cache, epoch 2's CPU-s/GB against store.batches'."""
    cells = sorted({(r["server"], r["latency_ms"], r["format"], r["kind"], r["method"], r["workers"]) for r in records
                    if r["kind"] in ("threads", "workers", "cache")})
    if not cells:
        return []
    lines = ["", "DataLoader(TorchDataset, persistent workers): MB/s and CPU-s/GB (training process + workers), "
             "epochs 1 and 2, ratios to num_workers=0 (each cell a fresh process); start: seconds to the first batch; "
             "ep1 running: from the first batch on", "server   +ms format  cell    method      W | MB/s ep1  ep2  "
             "x0 ep1  x0 ep2 | CPU/GB ep1  ep2  x0 ep1  x0 ep2 | start s | ep1 running x0 MB/s, CPU/GB", "-" * 130]
    for server, lat, fmt, kind, method, w in cells:
        at = dict(server=server, latency_ms=lat, format=fmt)
        cell = dict(at, method=method, workers=w)
        base = "cache" if kind == "cache" else "threads"
        mb = [med(kind, "mb_per_s", **cell, epoch=e) for e in (1, 2)]
        cpu = [med(kind, "cpu_s_per_gb", **cell, epoch=e) for e in (1, 2)]
        mb0 = [med(base, "mb_per_s", **at, workers=0, epoch=e) for e in (1, 2)]
        cpu0 = [med(base, "cpu_s_per_gb", **at, workers=0, epoch=e) for e in (1, 2)]
        start = med(kind, "start_s", **cell, epoch=1)
        run_mb, run_mb0 = med(kind, "running_mb_per_s", **cell, epoch=1), med(base, "running_mb_per_s", **at,
                                                                             workers=0, epoch=1)
        run_cpu, run_cpu0 = med(kind, "running_cpu_s_per_gb", **cell, epoch=1), \
            med(base, "running_cpu_s_per_gb", **at, workers=0, epoch=1)
        lines.append(f"{server:8} {lat:3} {fmt:7} {kind:7} {method:10} {w} | {mb[0]:8.0f} {mb[1]:4.0f} "
                     f"{mb[0] / mb0[0]:6.2f} {mb[1] / mb0[1]:6.2f} | {cpu[0]:10.2f} {cpu[1]:4.2f} "
                     f"{cpu[0] / cpu0[0]:6.2f} {cpu[1] / cpu0[1]:6.2f} | {start:7.2f} | {run_mb / run_mb0:6.2f} "
                     f"{run_cpu / run_cpu0:6.2f}")
        if kind == "cache":
            ref = med("store_batches_cache", "cpu_s_per_gb", **at)
            lines.append(f"{'':36}   epoch 2 from the cache: {cpu[1]:.2f} CPU-s/GB, store.batches' {ref:.2f} "
                         f"({cpu[1] / ref:.2f}x)")
    return lines
