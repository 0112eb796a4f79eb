"""The Spark repack job on local Spark with 1 and 2 cores, same data, one run: how it scales.
Runs the job as its users do (``python -m trainfeed.pipelines.repack``), each in a fresh JVM.

    python -m trainfeed.benchmarks.spark_repack_bench --out bench-out/spark-repack.jsonl [--gb 0.5]
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from trainfeed.training.metrics import environment

from .convert_bench import ensure_dataset


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench-out/spark-repack.jsonl")
    ap.add_argument("--work", default="bench-out/work")
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--cores", default="1,2")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    work = Path(args.work)
    src = ensure_dataset(work, args.gb)
    env = environment()
    rows = []
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as out:
        for rep in range(args.repeats):
            for cores in args.cores.split(","):
                dst = work / f"spark-repack-{cores}"
                shutil.rmtree(dst, ignore_errors=True)
                t0 = time.perf_counter()
                res = subprocess.run([sys.executable, "-m", "trainfeed.pipelines.repack", "--src", str(src), "--dst", str(dst),
                                      "--to", "delta", "--labels", str(src / "labels.csv"), "--cores", cores, "--json"],
                                     capture_output=True, text=True)
                seconds = time.perf_counter() - t0
                if res.returncode != 0:
                    raise SystemExit(res.stderr[-2000:])
                summary = json.loads(res.stdout.strip().splitlines()[-1])
                nbytes = sum(f.stat().st_size for f in src.glob("*.npy"))
                rec = {"bench": "spark-repack", "cores": int(cores), "repeat": rep, "seconds": seconds,
                       "mb_per_s": nbytes / seconds / 1e6, "samples": summary["samples"],
                       "partitions": summary["partitions"], "env": env}
                rows.append(rec)
                out.write(json.dumps(rec) + "\n")
                shutil.rmtree(dst, ignore_errors=True)
    for cores in args.cores.split(","):
        mine = sorted(r["seconds"] for r in rows if r["cores"] == int(cores))
        print(f"local[{cores}]: median {mine[len(mine) // 2]:.1f} s over {len(mine)} runs "
              f"(incl. JVM start), {rows[0]['samples']} samples")


if __name__ == "__main__":
    main()
