"""The report's text reads (issue #32): built from results.jsonl recorded by real runs, no line
of report.md holds a known broken pattern: a clause run into another ("was nothing was
timed"), a doubled word, a rate of 0 samples/s with no reason, empty parentheses, a value
printed as None, nan or inf.

The recordings (tests/benchmarks/report/data), on the 2-vCPU development VM:
- images-156.jsonl: ``storage-bench generate images imgs --count 156 --shape 96x128 --seed 1``, then
  ``storage-bench run imgs --nodes t4 --stores blob,parquet,delta,hdf5 --image-storage encoded
  --storage-backend local --storage-profile azure-blob --width 8 --batch-size 8 --steps 6 --workers 2``;
- volumes-156-repeats.jsonl: ``storage-bench generate volumes vols --count 156 --shape 30x30x10x2
  --seed 3``, then ``storage-bench run vols --nodes t4 --stores blob,parquet,delta,hdf5 --width 8
  --batch-size 100 --steps 4 --workers 2 --repeats 2``: one batch of 100 a pass, so no ingest-only
  pass timed anything."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from trainfeed.benchmarks.model.projection import parse_loader
from trainfeed.benchmarks.report import report

DATA = Path(__file__).parent / "data"
RECORDED = sorted(DATA.glob("*.jsonl"))

#: Each known broken pattern, and what it catches.
BROKEN = {
    "a clause run into another": re.compile(r"\b(was|is|were|are) nothing\b|\bwas \w+ was\b"),
    "a doubled word": re.compile(r"\b([A-Za-z]+) \1\b", re.I),
    "empty parentheses": re.compile(r"\(\s*\)"),
    "a missing value": re.compile(r"\b(None|nan|NaN|inf)\b"),
    "0 samples/s": re.compile(r"(?<![\d.,])0(\.0+)? (samples|images)/s"),
    "doubled punctuation": re.compile(r"[,;:] ?[,;:.]|\.\.(?!\.)| [,;:.](?!\w)"),
}


def broken(line: str) -> list[str]:
    """What is broken in one line of the report (a table row is checked cell by cell)."""
    parts = [c.strip() for c in line.strip("|").split(" | ")] if line.startswith("|") else [line]
    found = [f"{what}: {m.group(0)!r}" for part in parts for what, rx in BROKEN.items() if (m := rx.search(part))]
    return found


def zero_rates(md: str) -> list[str]:
    """Table cells of a rate column (its header ends in "/s") that say 0, with no reason."""
    out, header = [], None
    for line in md.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not set(line) <= set("|-"):
            out += [f"{h}: {line}" for h, c in zip(header, cells) if h.endswith("/s") and re.fullmatch(r"0(\.0+)?", c)]
    return out


@pytest.mark.parametrize("line", [
    "- **Layout effect**: not measured: the ingest-only read of blob was nothing was timed (too few batches)",
    "the best compacted store (delta) was was faster",
    "| blob | t4 | torch | 2,000 (estimate) | 0 samples/s | 450 |",
    "the read from local disk () took 3 ms",
    "bound by None",
    "a rate of nan samples/s",
    "a step of inf s",
    "delta is 1.8x faster, , at 3x the cost",
])
def test_the_check_finds_each_broken_pattern(line):
    assert broken(line), line


def test_the_check_finds_a_rate_cell_of_zero():
    table = "| store | ingest-only /s | real /s |\n|---|---|---|\n| blob | 0 | 450 |\n| delta | 1,200 | 0.0 |\n"
    assert zero_rates(table) == ["ingest-only /s: | blob | 0 | 450 |", "real /s: | delta | 1,200 | 0.0 |"]


def test_the_check_passes_what_reads_well():
    assert broken("- **Layout effect**: not measured: the ingest-only read of blob was not timed (too few batches: "
                  "raise --steps or use more samples); the projections use the reader's CPU time per sample.") == []
    assert broken("| blob | t4 | torch | 12,978 (estimate) | not timed (too few batches) | 333 | 0.65 |") == []
    assert broken("10 samples/s, 0.5 s, 1,000 samples/s") == []


@pytest.mark.parametrize("recorded", RECORDED, ids=[p.stem for p in RECORDED])
def test_a_report_of_a_recorded_run_reads_well(recorded, tmp_path):
    shutil.copy(recorded, tmp_path / "results.jsonl")
    # as `storage-bench run ... --baseline-loader concurrency=1,prefetch=off,framework=tf` builds it
    report.build(str(tmp_path), target_samples=2_000_000, target_epochs=5,
                 baseline=parse_loader("concurrency=1,prefetch=off,framework=tf"))
    md = (tmp_path / "report.md").read_text()
    assert "## What to do" in md and "## Why: each cell" in md  # the whole report, not a failure page
    problems = [f"{problem}\n    in: {line}" for line in md.splitlines() for problem in broken(line)]
    assert problems == [], "\n".join(problems)
    assert zero_rates(md) == []
