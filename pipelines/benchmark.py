"""Job entry points for the storage A/B on a cluster.

`run`: the matrix on the node this task runs on (e.g. a single-node CPU cluster, then a
single-node GPU cluster), results to OUT/<node-label>/results.jsonl. `merge`: concatenate
the cells of several such runs into OUT/results.jsonl and build one report.

    python -m trainfeed.pipelines.benchmark run --src DIR --out DIR --label cpu-node --nodes cpu
    python -m trainfeed.pipelines.benchmark merge --out DIR --inputs cpu-node,gpu-node
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.redact import redact
from trainfeed.pipelines.entry import run_job


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="trainfeed.pipelines.benchmark", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the matrix on this node")
    run.add_argument("--src", required=True, help="folder of small files (the blob layout)")
    run.add_argument("--out", required=True, help="results root (a Unity Catalog volume or DBFS path on Databricks)")
    run.add_argument("--label", required=True, help="name of this node's results folder, e.g. cpu-node")
    run.add_argument("--labels", default=None, help="labels CSV")
    run.add_argument("--nodes", default="cpu", help="cpu, cuda, or emulated profiles (t4, h100, ...)")
    run.add_argument("--stores", default="blob,delta")
    run.add_argument("--frameworks", default="torch")
    run.add_argument("--steps", type=int, default=30)
    run.add_argument("--cpu-steps", type=int, default=4)
    run.add_argument("--batch-size", type=int, default=32)
    run.add_argument("--width", type=int, default=64)
    run.add_argument("--workers", type=int, default=8)
    run.add_argument("--storage-profile", default="none", help="latency emulation around every store; none on a "
                     "real cloud (latency is real there)")
    merge = sub.add_parser("merge", help="merge several runs into one report")
    merge.add_argument("--out", required=True)
    merge.add_argument("--inputs", required=True, help="comma-separated labels of the runs under OUT")
    merge.add_argument("--target-samples", type=int, default=650_000)
    merge.add_argument("--target-epochs", type=int, default=5)
    return ap.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
    from trainfeed.benchmarks.ab.config import MatrixConfig
    from trainfeed.benchmarks.ab.matrix import run_matrix

    def csv(text):
        return tuple(x for x in text.split(",") if x)

    out = Path(args.out) / args.label
    cfg = MatrixConfig(src=args.src, out=str(out), labels_csv=args.labels, stores=csv(args.stores),
                       nodes=csv(args.nodes), frameworks=csv(args.frameworks), steps=args.steps,
                       cpu_steps=args.cpu_steps, batch_size=args.batch_size, width=args.width, workers=args.workers,
                       storage_profile=None if args.storage_profile == "none" else args.storage_profile)
    records = run_matrix(cfg, log=lambda m: print(redact(m), file=sys.stderr))
    summary = {"results": str(out / "results.jsonl"), "cells": sum(r["kind"] == "cell" for r in records),
               "errors": sum(r["kind"] == "error" for r in records)}
    if summary["errors"] and not summary["cells"]:
        raise TrainfeedError(f"{summary['results']}: no cell was measured: all {summary['errors']} failed "
                             "(the reasons are in the results file)")
    return summary


def merge(args: argparse.Namespace) -> dict:
    from trainfeed.benchmarks.report import report

    out = Path(args.out)
    lines = []
    for label in (x for x in args.inputs.split(",") if x):
        path = out / label / "results.jsonl"
        if not path.is_file():
            raise TrainfeedError(f"{path}: missing; did the '{label}' task run?")
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("node") and rec.get("kind") in ("cell", "error"):
                rec["node"] = f"{rec['node']}@{label}"  # keep cells of different clusters apart
            lines.append(json.dumps(rec))
    (out / "results.jsonl").write_text("\n".join(lines) + "\n")
    return report.build(str(out), target_samples=args.target_samples, target_epochs=args.target_epochs)


def main(argv: list[str] | None = None) -> int:
    """Entry point (console script and Databricks wheel task); a failure raises SystemExit."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return run_job(lambda: run(args) if args.command == "run" else merge(args))

if __name__ == "__main__":
    sys.exit(main())
