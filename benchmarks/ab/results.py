"""results.jsonl: the records a matrix writes (cells, errors, the location effect) as each one
ends, and reading them back for the report."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from trainfeed.benchmarks.ab.storage import Backend
from trainfeed.benchmarks.model.profiles import load_object_store
from trainfeed.benchmarks.records import Record
from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.redact import redact_obj

RESULTS_VERSION = 4


class ResultsFile:
    """results.jsonl, one redacted record per line, appended as each cell ends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[Record] = []

    def add(self, rec: Record) -> Record:
        rec = redact_obj(rec)
        self.records.append(rec)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(rec) + "\n")
        return rec


def storage_record(backend: Backend, url: str) -> Record:
    """Where a cell read from, with the latency profile's figures (the model needs them when
    the report is rebuilt from results.jsonl elsewhere)."""
    profile = load_object_store(backend.profile) if backend.profile else None
    return {**backend.describe(url), "profile_figures": asdict(profile) if profile else None}


def error_record(rep: int, store: str, node: str | None, framework: str | None, stage: str, error: str,
                  env: Record) -> Record:
    return {"kind": "error", "results_version": RESULTS_VERSION, "repeat": rep, "store": store, "node": node,
            "framework": framework, "stage": stage, "error": error, "env": env}


def load_results(out: str) -> list[Record]:
    path = Path(out) / "results.jsonl"
    if not path.is_file():
        raise TrainfeedError(f"{out}: no results.jsonl here; run `storage-bench run` first")
    records: list[Record] = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TrainfeedError(f"{path}, line {n}: not JSON: {exc}") from exc
        if rec.get("results_version") != RESULTS_VERSION:
            raise TrainfeedError(f"{path}, line {n}: results version {rec.get('results_version')!r}; this "
                                 f"storage-bench reads version {RESULTS_VERSION}: rerun `storage-bench run`")
        records.append(rec)
    return records


