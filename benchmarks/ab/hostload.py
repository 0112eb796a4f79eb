"""Was the machine busy while we measured? A rate measured on a machine that other processes (or
the hypervisor) are also using says more about them than about the store, so each measurement
window records the machine's load next to its figures and says plainly when it was contended.

Our own process's CPU time is subtracted from the machine's busy time: a reader that keeps every
core busy is the thing being measured, not contention."""
from __future__ import annotations

import os
import threading
import time
from types import TracebackType
from typing import Any

import psutil

#: Other processes using this much of the machine's CPU time take cores our reader would use.
OTHERS_BUSY_PCT = 25.0
#: Steal is CPU time the hypervisor gave to other guests; a few % already skews short runs.
STEAL_PCT = 5.0
#: Runnable tasks per core, ours left out, above which the run queue (CPU or disk) is backed up.
LOAD_PER_CORE = 1.5

PROC_STAT = "/proc/stat"


def cpu_seconds() -> float:
    """This process's CPU time, user + system, all its threads (not its children)."""
    t = os.times()
    return t.user + t.system


def children_cpu_seconds() -> dict[int, float]:
    """CPU time, user + system, of each live descendant process (the storage emulator a run
    started, Spark's JVM, ...): they work for this measurement, so their CPU is not "others'"."""
    out = {}
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
        except psutil.Error:  # gone since the listing
            continue
        out[child.pid] = t.user + t.system
    return out


def usable_cores() -> int:
    """Cores this process may run on (its affinity), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _read_stat() -> tuple[int, int, int] | None:
    """(total, idle, steal) jiffies of all CPUs from /proc/stat's ``cpu`` line; None without it."""
    try:
        with open(PROC_STAT) as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal (guest time is already inside user and nice)
    fields += [0] * (8 - len(fields))
    return sum(fields), fields[3] + fields[4], fields[7]


def _load_1m() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def classify(sample: dict[str, Any]) -> tuple[bool, list[str]]:
    """``(contended, reasons)`` from a summary's figures: ``cores``, ``others_busy_pct``,
    ``steal_pct`` (both None without /proc/stat), ``load_avg_1m_mean`` (None where unknown),
    ``process_cpu_s``, ``children_cpu_s`` (optional) and ``wall_s``."""
    reasons = []
    others = sample.get("others_busy_pct")
    if others is not None and others >= OTHERS_BUSY_PCT:
        reasons.append(f"other processes used {others:.0f}% of the machine's CPU time")
    steal = sample.get("steal_pct")
    if steal is not None and steal >= STEAL_PCT:
        reasons.append(f"hypervisor steal {steal:.0f}%")
    load, cores = sample.get("load_avg_1m_mean"), sample["cores"]
    if load is not None:
        mine = sample["process_cpu_s"] + (sample.get("children_cpu_s") or 0.0)
        ours = mine / sample["wall_s"] if sample["wall_s"] > 0 else 0.0
        per_core = (load - ours) / cores
        if per_core > LOAD_PER_CORE:
            reasons.append(f"load average {load:.1f} on {cores} cores, {per_core:.1f} per core "
                           f"not ours")
    return bool(reasons), reasons


#: (monotonic time, this process's CPU-seconds, /proc/stat's (total, idle, steal), children's CPU-seconds by pid).
_Snapshot = tuple[float, float, tuple[int, int, int] | None, dict[int, float]]


class LoadMonitor:
    """Context manager over a measurement window; ``summary()`` afterwards (or during it).

    /proc/stat and our CPU time are read at the window's ends; the 1-minute load average, which
    moves slowly, is sampled every ``interval`` seconds by a daemon thread."""

    def __init__(self, interval: float = 0.5, *, include_children: bool = False) -> None:
        """``include_children``: count the CPU of this process's live descendants (a storage
        emulator the run started) as ours, not as other processes'."""
        self.interval = interval
        self.include_children = include_children
        self._loads: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start: _Snapshot | None = None
        self._end: _Snapshot | None = None

    def _snapshot(self) -> _Snapshot:
        return (time.monotonic(), cpu_seconds(), _read_stat(),
                children_cpu_seconds() if self.include_children else {})

    def _sample_load(self) -> None:
        load = _load_1m()
        if load is not None:
            self._loads.append(load)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample_load()

    def __enter__(self) -> LoadMonitor:
        self._sample_load()
        self._start = self._snapshot()
        self._thread = threading.Thread(target=self._run, name="load-monitor", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._end = self._snapshot()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample_load()

    def summary(self) -> dict[str, Any]:
        """JSON-able figures of the window, with ``contended`` and its ``reasons``."""
        if self._start is None:
            raise RuntimeError("LoadMonitor.summary() before the window started")
        t0, cpu0, stat0, kids0 = self._start
        t1, cpu1, stat1, kids1 = self._end or self._snapshot()
        cores = usable_cores()
        wall = max(t1 - t0, 1e-9)
        process_cpu = max(cpu1 - cpu0, 0.0)
        children_cpu = sum(max(c - kids0.get(pid, 0.0), 0.0) for pid, c in kids1.items())
        busy = steal = others = None
        if stat0 is not None and stat1 is not None and stat1[0] > stat0[0]:
            total, idle, stolen = (b - a for a, b in zip(stat0, stat1))
            steal = 100.0 * stolen / total
            busy = 100.0 * (total - idle - stolen) / total
            # our CPU time (and our children's) as a share of the same jiffies, so machine and
            # process figures compare
            ours = 100.0 * (process_cpu + children_cpu) * os.sysconf("SC_CLK_TCK") / total
            others = max(busy - ours, 0.0)
        loads = list(self._loads)
        out: dict[str, Any] = {
            "cores": cores,
            "load_avg_1m_max": round(max(loads), 2) if loads else None,
            "load_avg_1m_mean": round(sum(loads) / len(loads), 2) if loads else None,
            "steal_pct": _round(steal),
            "busy_pct": _round(busy),
            "process_cpu_s": round(process_cpu, 3),
            "wall_s": round(wall, 3),
            "process_cpu_share": round(process_cpu / (wall * cores), 3),
            "children_cpu_s": round(children_cpu, 3),
            "others_busy_pct": _round(others),
        }
        out["contended"], out["reasons"] = classify(out)
        return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


class ProcessesCPU:
    """CPU-seconds of this process and the children it starts from now on (DataLoader workers,
    not the storage servers already running), read on demand: a child's last reading stands
    once it has exited."""

    def __init__(self) -> None:
        self.me = psutil.Process()
        self._before = {c.pid for c in self.me.children(recursive=True)}
        self._children: dict[int, float] = {}

    def children(self) -> float:
        """The new children's CPU-seconds (each as last read)."""
        for child in self.me.children(recursive=True):
            if child.pid in self._before:
                continue
            try:
                t = child.cpu_times()
                self._children[child.pid] = t.user + t.system
            except psutil.Error:
                pass
        return sum(self._children.values())

    def seconds(self) -> float:
        t = self.me.cpu_times()
        return float(t.user + t.system) + self.children()
