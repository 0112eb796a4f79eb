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
from typing import Any

from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.option_docs import add_option
from trainfeed.converters.redact import redact
from trainfeed.pipelines.entry import run_job


def parse_args(argv: list[str]) -> argparse.Namespace:
    from trainfeed.benchmarks.ab.config import MatrixConfig, ReportConfig

    ap = argparse.ArgumentParser(prog="trainfeed.pipelines.benchmark", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the matrix on this node")
    run.add_argument("--src", required=True, help="folder of small files (the blob layout)")
    run.add_argument("--out", required=True, help="results root (a Unity Catalog volume or DBFS path on Databricks)")
    run.add_argument("--label", required=True, help="name of this node's results folder, e.g. cpu-node")
    for name in ("labels_csv", "frameworks", "steps", "cpu_steps", "batch_size", "width"):
        add_option(run, MatrixConfig, name)
    # a job on a cluster node: that node, the stores that answer the question, more reader
    # threads (a cloud's latency is real there, so no emulation)
    add_option(run, MatrixConfig, "nodes", default="cpu")
    add_option(run, MatrixConfig, "stores", default="blob,delta")
    add_option(run, MatrixConfig, "workers", default=8)
    add_option(run, MatrixConfig, "storage_profile", default="none")
    merge = sub.add_parser("merge", help="merge several runs into one report")
    merge.add_argument("--out", required=True)
    merge.add_argument("--inputs", required=True, help="comma-separated labels of the runs under OUT")
    add_option(merge, ReportConfig, "target_samples")
    add_option(merge, ReportConfig, "target_epochs")
    return ap.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from trainfeed.benchmarks.ab.config import MatrixConfig
    from trainfeed.benchmarks.ab.matrix import run_matrix

    def csv(text: str) -> tuple[str, ...]:
        return tuple(x for x in text.split(",") if x)

    out = Path(args.out) / args.label
    cfg = MatrixConfig(src=args.src, out=str(out), labels_csv=args.labels_csv, stores=csv(args.stores),
                       nodes=csv(args.nodes), frameworks=csv(args.frameworks), steps=args.steps,
                       cpu_steps=args.cpu_steps, batch_size=args.batch_size, width=args.width, workers=args.workers,
                       storage_profile=None if args.storage_profile == "none" else args.storage_profile)
    records = run_matrix(cfg, log=lambda m: print(redact(m), file=sys.stderr))
    summary: dict[str, Any] = {"results": str(out / "results.jsonl"),
                               "cells": sum(r["kind"] == "cell" for r in records),
                               "errors": sum(r["kind"] == "error" for r in records)}
    if summary["errors"] and not summary["cells"]:
        raise TrainfeedError(f"{summary['results']}: no cell was measured: all {summary['errors']} failed "
                             "(the reasons are in the results file)")
    return summary


def merge(args: argparse.Namespace) -> dict[str, Any]:
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
