"""The Spark repack job next to ``convert`` on the same dataset, each with 1 and 2 cores: wall
time and CPU-seconds. Both run as their users run them (``python -m trainfeed.pipelines.repack
--cores N``, ``python -m trainfeed.converters --workers N``), each in a fresh process (Spark:
a fresh JVM, start-up included).

CPU-seconds are those of the whole process tree, the larger of two lower bounds: what the
kernel accounts to this process for its reaped descendants (it becomes a child subreaper, so
orphans are reaped here), and the sum of each descendant's own CPU time as last seen by
polling every 0.1 s. The first alone misses Spark's Python workers (measured on 1 GB: 7.4 of
22 CPU-s; their parent does not wait for them); the second misses at most the last 0.1 s of
each process.

    python -m trainfeed.benchmarks.micro.spark_repack_bench --files 5000 --shape 8,8,4,1 [--repeats 2]
    python -m trainfeed.benchmarks.micro.spark_repack_bench --gb 0.5
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainfeed.benchmarks.ab.hostload import children_cpu_seconds
from trainfeed.benchmarks.micro.convert_bench import ensure_dataset
from trainfeed.benchmarks.synth import generate_volumes
from trainfeed.training.metrics import environment

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """Orphaned descendants are re-parented to this process (Linux), which reaps them."""
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def reap_all(timeout_s: float = 60.0) -> None:
    """Wait for every descendant re-parented here (a JVM's Python daemon exits just after it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.05)
    raise SystemExit(f"descendants still running after {timeout_s:.0f} s: CPU time would be undercounted")


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(cmd: list[str], poll_s: float = 0.1) -> tuple[float, float, str]:
    """Run ``cmd``; (wall seconds, CPU-seconds of its whole process tree, its stdout)."""
    cpu0, t0 = children_cpu_s(), time.perf_counter()
    last_seen: dict[int, float] = {}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        while proc.poll() is None:
            last_seen.update(children_cpu_seconds())
            time.sleep(poll_s)
        reap_all()
        seconds, reaped = time.perf_counter() - t0, children_cpu_s() - cpu0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}\n{stderr[-2000:]}")
    return seconds, max(reaped, sum(last_seen.values())), stdout


def commands(tool: str, src: Path, dst: Path, cores: str) -> list[str]:
    labels = str(src / "labels.csv")
    if tool == "spark-repack":
        return [sys.executable, "-m", "trainfeed.pipelines.repack", "--src", str(src), "--dst", str(dst),
                "--to", "delta", "--labels", labels, "--cores", cores, "--json"]
    return [sys.executable, "-m", "trainfeed.converters", str(src), str(dst), "--to", "delta", "--labels", labels,
            "--workers", cores, "--no-progress", "--json"]


def dataset(args: argparse.Namespace) -> Path:
    work = Path(args.work)
    if args.files is None:
        return ensure_dataset(work, args.gb)
    shape = tuple(int(n) for n in args.shape.split(","))
    src = work / f"volumes-{args.files}-{'x'.join(map(str, shape))}"
    if not (src / "labels.csv").exists():
        shutil.rmtree(src, ignore_errors=True)
        generate_volumes(src, args.files, shape=shape)
    return src


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench-out/spark-repack.jsonl")
    ap.add_argument("--work", default="bench-out/work")
    ap.add_argument("--gb", type=float, default=1.0, help="dataset of full-size volumes (when --files is not given)")
    ap.add_argument("--files", type=int, default=None, help="dataset of this many volumes of --shape instead")
    ap.add_argument("--shape", default="8,8,4,1", help="volume shape with --files (8,8,4,1: 1 KB of float32)")
    ap.add_argument("--cores", default="1,2")
    ap.add_argument("--tools", default="spark-repack,convert")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    become_subreaper()
    src = dataset(args)
    files = sorted(src.glob("*.npy"))
    nbytes = sum(f.stat().st_size for f in files)
    env, rows = environment(), []
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as out:
        for rep in range(args.repeats):
            for tool in args.tools.split(","):
                for cores in args.cores.split(","):
                    dst = Path(args.work) / f"{tool}-{cores}.delta"
                    shutil.rmtree(dst, ignore_errors=True)
                    seconds, cpu, stdout = timed(commands(tool, src, dst, cores))
                    shutil.rmtree(dst, ignore_errors=True)
                    summary = json.loads(stdout.strip().splitlines()[-1])
                    rec = {"bench": "spark-repack", "tool": tool, "cores": int(cores), "repeat": rep,
                           "files": len(files), "bytes": nbytes, "seconds": seconds, "cpu_s": cpu,
                           "cpu_s_per_gb": cpu / nbytes * 1e9, "samples": summary["samples"],
                           "spark_tasks": summary.get("partitions"), "load_1m": os.getloadavg()[0], "env": env}
                    rows.append(rec)
                    out.write(json.dumps(rec) + "\n")
                    out.flush()
    print(f"{len(files):,} files, {nbytes / 1e6:,.1f} MB; median over {args.repeats} run(s), start-up included")
    for tool in args.tools.split(","):
        for cores in args.cores.split(","):
            mine = [r for r in rows if r["tool"] == tool and r["cores"] == int(cores)]
            wall = sorted(r["seconds"] for r in mine)[len(mine) // 2]
            cpu = sorted(r["cpu_s"] for r in mine)[len(mine) // 2]
            print(f"{tool:>13} {cores} core(s): {wall:7.1f} s wall, {cpu:7.1f} CPU-s, "
                  f"{cpu / nbytes * 1e9:9.1f} CPU-s/GB")


if __name__ == "__main__":
    main()
