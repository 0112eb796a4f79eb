"""When two projections can be told apart. A projection row's ``spread`` is how far it moves
between the run's repeats (each repeat's measurements projected alone); two rows closer than
the larger of their spreads are level: neither is "faster". A run without repeats has no
spread to go by and is judged by a stated threshold."""
from __future__ import annotations

from trainfeed.benchmarks.model.profiles import ObjectStore
from trainfeed.benchmarks.model.projection import Layout, Loader, Machine, project
from trainfeed.benchmarks.records import ProjectionRow

#: Without repeats, projections closer than this are level. An assumption: back-to-back
#: ingest-only passes of the same 152 small files on the 2-vCPU development VM moved by 1-14% in
#: CPU per sample; `storage-bench run --repeats N` measures a run's own spread.
LEVEL_WITHOUT_REPEATS = 0.10
SPREAD = "the spread of their projections over the run's repeats"
THRESHOLD = "the stated threshold for a run without repeats"


def spread(machine: Machine, layouts: list[Layout], loader: Loader, storage: ObjectStore | None,
           batch: int) -> float | None:
    """How far a projection moves between repeats: the slowest of ``layouts`` (one per repeat)
    projected on ``machine`` over the fastest, minus one; None for fewer than two repeats."""
    if len(layouts) < 2:
        return None
    rates = [project(machine, lay, loader, storage, batch).samples_per_s for lay in layouts]
    return max(rates) / min(rates) - 1


def margin(a: ProjectionRow, b: ProjectionRow) -> tuple[float, str]:
    """The relative difference under which rows ``a`` and ``b`` are level, and where it comes from."""
    spreads = [r["spread"] for r in (a, b) if r["spread"] is not None]
    return (max(spreads), SPREAD) if spreads else (LEVEL_WITHOUT_REPEATS, THRESHOLD)


def level(a: ProjectionRow, b: ProjectionRow) -> bool:
    """Whether two projection rows' times are within the noise of each other."""
    low, high = sorted((a["seconds"], b["seconds"]))
    return bool(high <= low * (1 + margin(a, b)[0]))


def within(a: ProjectionRow, b: ProjectionRow) -> str:
    """"within 4%, the spread of ...": the margin of ``a`` and ``b``, in words."""
    m, how = margin(a, b)
    return f"within {m:.0%}, {how}"


def rule(rows: list[ProjectionRow]) -> str:
    """The rule ``level`` applies to ``rows``, in words."""
    if any(r["spread"] is not None for r in rows):
        return f"within {SPREAD} (each repeat's measurements projected alone; the larger of the two)"
    return f"within {LEVEL_WITHOUT_REPEATS:.0%}, {THRESHOLD}"
