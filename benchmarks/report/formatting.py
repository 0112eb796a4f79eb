"""How the report words a value: durations, rates and dollars to a few significant figures, and
a record's storage and connection budget."""
from __future__ import annotations

from trainfeed.benchmarks.model.advice import significant


def place(rec) -> str:
    st = rec["storage"]
    return f"{st['backend']} storage, " + (f"emulated {st['profile']} latency" if st["profile"] else "no latency emulation")


def budget(rec) -> str:
    conn = rec["connections"]
    requests = f", {conn['io_concurrency']} requests in flight" if conn["io_concurrency"] else " (local reads)"
    return f"{conn['reader_workers']} reader workers{requests}"


def fmt_time(seconds: float | None) -> str:
    """A duration to 2 significant figures: "45 s", "19 min", "1.8 h", "31 h"."""
    if not seconds:
        return "-"
    if seconds < 90:
        return f"{significant(seconds):g} s"
    if seconds < 90 * 60:
        return f"{significant(seconds / 60):g} min"
    return f"{significant(seconds / 3600):g} h"


def fmt_rate(value: float) -> str:
    """Samples/s to 3 significant figures: "0.84", "399", "1,000", "105,000"."""
    v = significant(value, 3)
    return f"{v:,.0f}" if v >= 1000 else f"{v:g}"


def fmt_usd(value: float | None) -> str:
    """Dollars to 2 significant figures ("$0.53", "$1.2", "$1,200"), "-" when unknown."""
    if value is None:
        return "-"
    v = significant(value)
    return f"${v:,.0f}" if v >= 100 else f"${v:g}"
