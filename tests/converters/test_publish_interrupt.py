"""Issue #24 item 3: Ctrl-C (SIGINT) or SIGTERM at any moment before the publishing step
publishes nothing, uploads still pending included; from that step on, the store is complete.
Either way the run exits 130 (SIGINT) or 143 (SIGTERM) with one line.

Real servers (Azurite, s3rver) behind a loopback relay (``HoldGate``) that holds one request:
the first upload of a data part (so the run is waiting on a pending upload when the signal
comes, everything else written), or the commit record (so the signal comes while it is being
published). The relay then releases the request and the run goes on to its end."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.converters.relay import HoldGate
from tests.test_object_storage import REPO, TINY, labels, rows_of_batches, source, truth_rows

pytestmark = pytest.mark.slow

KINDS = {"parquet": ("parquet", "store.parquet"), "delta": ("delta", "store.delta"),
         "hdf5-shards": ("hdf5", "store_shards"), "hdf5": ("hdf5", "store.h5")}
#: The first upload of a data part (Parquet, Delta, HDF5 shard), or of an HDF5 file's trial copy.
PART_PUT = rb"^PUT \S*/(?:(?:part|shard)-\d{5}-|store\.h5\.trainfeed-tmp-)"
#: The commit: the manifest, a Delta log entry, or the single HDF5 object itself.
COMMIT_PUT = rb"^PUT \S*(?:_trainfeed\.json|/_delta_log/|/store\.h5 )"


@dataclass
class Server:
    """One storage endpoint: where a test's objects go, options direct and through a relay."""

    name: str
    port: int
    root: str  # scheme://bucket[/prefix]: a fresh place per test
    options: dict

    def url(self, key: str) -> str:
        return f"{self.root}/{key}"

    def through(self, gate: HoldGate) -> list[str]:
        """CLI storage options reaching this server through ``gate``."""
        out = []
        for k, v in self.options.items():
            out += ["--storage-option", f"{k}={str(v).replace(f':{self.port}', f':{gate.port}')}"]
        return out

    def cli(self) -> list[str]:
        return [a for k, v in self.options.items() for a in ("--storage-option", f"{k}={v}")]

    def keys(self) -> list[str]:
        from trainfeed.converters.storage.location import locate

        loc = locate(self.root, self.options)
        return sorted(p[len(loc.path) + 1:] for p in loc.fs.find(loc.path))


@pytest.fixture(scope="module")
def s3rver_server():
    from trainfeed.benchmarks.emulators import s3rver

    with s3rver.start("tf24") as server:
        yield server


@pytest.fixture
def server(request) -> Server:
    """The server named by the test's parameters (``paired``)."""
    if request.param == "azurite":
        azurite = request.getfixturevalue("azurite_server")
        container = f"intr-{uuid.uuid4().hex[:12]}"
        azurite.create_container(container)
        return Server("azurite", azurite.port, f"abfs://{container}", dict(azurite.storage_options))
    s3 = request.getfixturevalue("s3rver_server")
    return Server("s3rver", s3.port, f"s3://tf24/{uuid.uuid4().hex[:12]}", dict(s3.storage_options))


def read_rows(server: Server, url: str) -> list:
    import trainfeed

    store = trainfeed.open_store(url, storage_options=server.options)
    return sorted(rows_of_batches(store.batches(batch_size=7, shuffle=False, drop_last=False)))


def convert_cli(server: Server, src: Path, url: str, kind: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainfeed.converters", str(src), url, "--to", KINDS[kind][0],
                           *server.cli(), *labels(src), *TINY, "--no-progress", *extra],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})


def run_until_held(server: Server, gate: HoldGate, src: Path, url: str, kind: str, sig: int, *extra: str
                   ) -> subprocess.CompletedProcess:
    """convert through ``gate``; once the gate holds its request and every other upload has
    landed (the object count steady for a second), send ``sig``, then release the request."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainfeed.converters", str(src), url, "--to", KINDS[kind][0], *server.through(gate),
         *labels(src), *TINY, "--workers", "1", "--no-progress", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        while not gate.held.wait(0.2):
            if proc.poll() is not None:
                pytest.fail(f"convert ended (exit {proc.returncode}) before its request was held: "
                            f"{proc.stderr.read()[-2000:]}")
        seen, steady_since, deadline = None, time.monotonic(), time.monotonic() + 30
        while time.monotonic() - steady_since < 1.0 and time.monotonic() < deadline:
            now = len(server.keys())
            if now != seen:
                seen, steady_since = now, time.monotonic()
            time.sleep(0.1)
        proc.send_signal(sig)
        time.sleep(0.5)  # the handler has run: the main thread waits on the held request
        gate.release()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        gate.close()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}
SERVERS = ["azurite", "s3rver"]


def paired(kinds: list[str] | None = None) -> pytest.MarkDecorator:
    """(server, [kind,] signal) cases: each kind on both servers, the signal alternating, so that
    every signal meets every kind and every server: half the full product. The two signals take
    one handler (converters/interrupt.py) and differ in how the run unwinds and its exit code."""
    cases = []
    for i, kind in enumerate(kinds or [None]):
        for j, name in enumerate(SERVERS):
            sig = list(EXIT)[(i + j) % 2]
            values = (name, sig) if kind is None else (name, kind, sig)
            cases.append(pytest.param(*values, id="-".join(filter(None, [name, kind, sig.name]))))
    return pytest.mark.parametrize("server,sig" if kinds is None else "server,kind,sig", cases, indirect=["server"])


@pytest.mark.azurite
@paired(["parquet", "delta", "hdf5-shards", "hdf5"])
def test_a_signal_while_uploads_are_pending_publishes_nothing(server, tmp_path, kind, sig):
    """The writer is done and the run waits on its last upload (for a single HDF5 file with
    --verify, on its trial copy's): the signal then publishes nothing and removes every object
    the run uploaded. Before issue #24 SIGINT published the store (exit 0) and SIGTERM killed
    the run, its parts left behind."""
    truth = source(tmp_path / "src", 48, seed=5)
    url = server.url(KINDS[kind][1])
    gate = HoldGate(server.port, PART_PUT)
    done = run_until_held(server, gate, tmp_path / "src", url, kind, sig, *(["--verify"] if kind == "hdf5" else []))
    assert done.returncode == EXIT[sig], done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "nothing was published" in lines[0], done.stderr
    assert server.keys() == [], "objects left after an interrupted run"
    assert convert_cli(server, tmp_path / "src", url, kind).returncode == 0
    assert read_rows(server, url) == truth_rows(truth)


@pytest.mark.azurite
@paired()
def test_a_signal_while_an_overwrite_uploads_keeps_the_old_store(server, tmp_path, sig):
    old, new = tmp_path / "old", tmp_path / "new"
    old_truth, _ = source(old, 12, seed=1), source(new, 48, seed=2)
    url = server.url("store.parquet")
    assert convert_cli(server, old, url, "parquet").returncode == 0
    before = server.keys()
    gate = HoldGate(server.port, PART_PUT)
    done = run_until_held(server, gate, new, url, "parquet", sig, "--overwrite")
    assert done.returncode == EXIT[sig], done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert server.keys() == before
    assert read_rows(server, url) == truth_rows(old_truth)


@pytest.mark.azurite
@paired(["parquet", "delta", "hdf5"])
def test_a_signal_during_the_commit_leaves_the_complete_store(server, tmp_path, kind, sig):
    """The signal arrives while the commit record's PUT (the Delta commit, the HDF5 object) is
    in flight: the store is published whole, and the run still says it was interrupted."""
    truth = source(tmp_path / "src", 48, seed=6)
    url = server.url(KINDS[kind][1])
    gate = HoldGate(server.port, COMMIT_PUT)
    done = run_until_held(server, gate, tmp_path / "src", url, kind, sig)
    assert done.returncode == EXIT[sig], done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "published" in lines[0] and "complete" in lines[0], done.stderr
    assert read_rows(server, url) == truth_rows(truth)
