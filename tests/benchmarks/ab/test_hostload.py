"""`hostload`: the contention rules on hand-made figures, then real windows on this machine, idle or
busy: one where other processes spin on every core, one where our own thread spins, one where a
child of ours spins. Each asserts what holds whatever else the machine runs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trainfeed.benchmarks.ab import hostload
from trainfeed.benchmarks.ab.hostload import LoadMonitor, classify, cpu_seconds

IDLE = {"cores": 2, "others_busy_pct": 3.0, "steal_pct": 0.0, "load_avg_1m_mean": 0.3,
        "process_cpu_s": 0.1, "wall_s": 10.0}


@pytest.mark.parametrize("changes, contended, reason", [
    ({}, False, None),
    ({"others_busy_pct": 24.9}, False, None),
    ({"others_busy_pct": 61.0}, True, "other processes used 61% of the machine's CPU time"),
    ({"steal_pct": 8.0}, True, "hypervisor steal 8%"),
    ({"steal_pct": 4.9}, False, None),
    # 5 runnable tasks on 2 cores, none of them ours: 2.5 per core
    ({"load_avg_1m_mean": 5.0}, True, "load average 5.0 on 2 cores, 2.5 per core not ours"),
    # the same load average while our reader keeps 4 threads busy: 0.5 per core is not ours
    ({"load_avg_1m_mean": 5.0, "process_cpu_s": 40.0}, False, None),
    # our own reader keeping both cores busy: /proc/stat's busy time minus ours left nothing
    ({"others_busy_pct": 0.0, "load_avg_1m_mean": 2.1, "process_cpu_s": 20.0}, False, None),
    # no /proc/stat and no load average (not Linux): nothing to say
    ({"others_busy_pct": None, "steal_pct": None, "load_avg_1m_mean": None}, False, None),
])
def test_classify(changes, contended, reason):
    got, reasons = classify({**IDLE, **changes})
    assert got is contended
    assert reasons == ([reason] if reason else [])


def test_classify_gives_every_reason():
    got, reasons = classify({**IDLE, "others_busy_pct": 40.0, "steal_pct": 12.0})
    assert got and reasons == ["other processes used 40% of the machine's CPU time", "hypervisor steal 12%"]


def _spinners(n: int) -> list[subprocess.Popen]:
    """n processes spinning until killed, each already spinning when this returns (however long
    a busy machine takes to start an interpreter)."""
    code = "import sys\nprint('spinning', flush=True)\nwhile True: pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(n)]
    for p in procs:
        assert p.stdout.readline() == "spinning\n"
    return procs


def _window(seconds: float, during=None) -> dict:
    with LoadMonitor(interval=0.1) as mon:
        if during is None:
            time.sleep(seconds)
        else:
            during(seconds)
    return mon.summary()


needs_proc_stat = pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux /proc/stat")


@needs_proc_stat
def test_other_processes_spinning_are_contention():
    """A process spinning on every core through the whole window: whatever else the machine runs,
    nearly all of its CPU time is other processes' (we only sleep), so the window is contended."""
    procs = _spinners(hostload.usable_cores())
    try:
        busy = _window(1.0)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert busy["others_busy_pct"] >= 60, busy
    assert busy["busy_pct"] >= busy["others_busy_pct"]
    assert busy["process_cpu_s"] < 0.2  # we only slept
    assert busy["contended"] is True
    assert any(r.startswith("other processes used") for r in busy["reasons"])
    json.dumps(busy)


@needs_proc_stat
def test_our_own_spinning_thread_is_not_contention():
    """Our own thread spinning is the measurement, not contention: the machine's busy time holds
    it and the other processes' share leaves it out, in the same window, however busy the
    machine was before or during it."""

    def spin_in_a_thread(cpu_s: float) -> None:
        def spin() -> None:  # a fixed amount of CPU time, however busy the machine is
            end = time.thread_time() + cpu_s
            while time.thread_time() < end:
                pass
        t = threading.Thread(target=spin)
        t.start()
        t.join()

    ours = _window(0.5, spin_in_a_thread)
    # 0.5 CPU seconds in one thread (os.times counts in clock ticks: up to two ticks short),
    # never more than every core for the whole window
    tick = 1 / os.sysconf("SC_CLK_TCK")
    assert 0.5 - 2 * tick <= ours["process_cpu_s"] <= ours["wall_s"] * ours["cores"] + 0.05, ours
    assert ours["process_cpu_share"] == pytest.approx(ours["process_cpu_s"] / (ours["wall_s"] * ours["cores"]),
                                                      abs=2e-3)
    share = 100 * ours["process_cpu_share"]
    assert ours["busy_pct"] >= share * 0.8, ours  # the machine saw our spinning...
    assert ours["others_busy_pct"] <= ours["busy_pct"] - share * 0.8, ours  # ...as ours, not others'
    # what others did in the window, if anything, is all a reason may name
    assert any(r.startswith("other processes used") for r in ours["reasons"]) == (
        ours["others_busy_pct"] >= hostload.OTHERS_BUSY_PCT), ours


def test_cpu_seconds_counts_other_threads():
    before = cpu_seconds()
    t = threading.Thread(target=lambda: sum(i * i for i in range(2_000_000)))
    t.start()
    t.join()
    assert cpu_seconds() - before > 0.02


def test_without_proc_stat(monkeypatch):
    monkeypatch.setattr(hostload, "PROC_STAT", "/nonexistent/stat")
    with LoadMonitor(interval=0.05) as mon:
        time.sleep(0.12)
    s = mon.summary()
    assert s["steal_pct"] is None and s["busy_pct"] is None and s["others_busy_pct"] is None
    assert s["wall_s"] >= 0.12 and s["cores"] >= 1
    assert s["load_avg_1m_max"] >= s["load_avg_1m_mean"] >= 0
    assert isinstance(s["contended"], bool)


def test_a_child_process_works_for_us_not_against_us():
    """A storage emulator the run started (here: a spinning child, alive through the window) is
    part of the measurement with include_children: its CPU counts as ours, not as others'. Two
    monitors watch the same window, so other load on the machine cancels out."""
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        with LoadMonitor(interval=0.2) as without, LoadMonitor(interval=0.2, include_children=True) as with_:
            time.sleep(1.0)
        a, b = without.summary(), with_.summary()
    finally:
        child.kill()
        child.wait()
    assert b["children_cpu_s"] >= 0.1 and a["children_cpu_s"] == 0, (a, b)  # 0.1: however busy the machine
    if a["others_busy_pct"] is not None:  # the child's share of the machine moves from others' to ours
        share = 100 * b["children_cpu_s"] / (b["wall_s"] * b["cores"])
        assert a["others_busy_pct"] - b["others_busy_pct"] >= share - 10, (a, b, share)
