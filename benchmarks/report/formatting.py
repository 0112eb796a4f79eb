"""How the report words a value: durations, rates, ratios and dollars to a few significant
figures in fixed notation (never 1.2e+02), and a record's storage and connection budget."""
from __future__ import annotations

import math

from trainfeed.benchmarks.model.advice import significant
from trainfeed.benchmarks.records import Record


def place(rec: Record) -> str:
    st = rec["storage"]
    return (f"{st['backend']} storage, "
            + (f"emulated {st['profile']} latency" if st["profile"] else "no latency emulation"))


def budget(rec: Record) -> str:
    conn = rec["connections"]
    requests = f", {conn['io_concurrency']} requests in flight" if conn["io_concurrency"] else " (local reads)"
    return f"{conn['reader_workers']} reader workers{requests}"


def fmt_num(value: float | None, digits: int = 2) -> str:
    """``value`` to ``digits`` significant figures, in fixed notation with thousands separators
    and no trailing zeros: "0.00034", "1.2", "0.5", "120", "1,200", "-" when unknown."""
    if value is None or not math.isfinite(value):
        return "-"
    v = significant(value, digits)
    if v == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(v))))
    text = f"{v:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def fmt_ratio(value: float | None) -> str:
    """A speed-up or cost ratio: "1.4x", "12x", "120x"."""
    return "-" if value is None else f"{fmt_num(value)}x"


def fmt_time(seconds: float | None) -> str:
    """A duration to 2 significant figures: "45 s", "19 min", "1.8 h", "31 h"."""
    if not seconds:
        return "-"
    if seconds < 90:
        return f"{fmt_num(seconds)} s"
    if seconds < 90 * 60:
        return f"{fmt_num(seconds / 60)} min"
    return f"{fmt_num(seconds / 3600)} h"


def fmt_rate(value: float) -> str:
    """Samples/s to 3 significant figures: "0.84", "399", "1,000", "105,000"."""
    return fmt_num(value, 3)


def fmt_usd(value: float | None) -> str:
    """Dollars to 2 significant figures ("$0.53", "$1.2", "$1,200"), "-" when unknown."""
    if value is None:
        return "-"
    return f"${fmt_num(value)}"
