"""`python -m trainfeed.benchmarks.emulators.azurite` (the README's walkthrough runs it with `&`):
SIGTERM stops its node process too (it runs in a session of its own and would outlive us)."""
from __future__ import annotations

import signal
import subprocess
import sys

import psutil
import pytest

from trainfeed.benchmarks.emulators.azurite import AzuriteError, find_binary
from trainfeed.benchmarks.emulators.localserver import free_port


@pytest.mark.azurite
def test_sigterm_stops_the_node_process(tmp_path):
    try:
        find_binary()
    except AzuriteError as exc:
        pytest.skip(str(exc))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "trainfeed.benchmarks.emulators.azurite", "--port", str(port),
                             "--location", str(tmp_path / "data")], stdout=subprocess.PIPE, text=True)
    try:
        assert "Azurite is listening on" in proc.stdout.readline()
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children, "no node process"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        _, alive = psutil.wait_procs(children, timeout=10)
        assert alive == [], [p.cmdline() for p in alive]
    finally:
        if proc.poll() is None:
            proc.kill()
