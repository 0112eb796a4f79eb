"""`python -m trainfeed.benchmarks.emulators.s3rver` (the README's S3 walkthrough runs it with `&`):
it serves the bucket at the options it prints, and Ctrl-C stops its node process too (it runs
in a session of its own and would outlive us)."""
from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import pytest

from tests.test_readme_walkthroughs import block, port_taken, run_bash
from trainfeed.benchmarks.emulators.localserver import free_port
from trainfeed.benchmarks.emulators.s3rver import S3rverError, find_binary
from trainfeed.converters.storage.config import parse_storage_options
from trainfeed.converters.storage.filesystems import open_fs


@pytest.fixture(autouse=True)
def s3rver_installed():
    try:
        find_binary()
    except S3rverError as exc:
        pytest.skip(str(exc))


@pytest.mark.s3
def test_serves_the_bucket_at_the_printed_options_and_ctrl_c_stops_it(tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "trainfeed.benchmarks.emulators.s3rver", "--bucket", "cli-test",
                             "--port", str(port), "--dir", str(tmp_path / "s3")], stdout=subprocess.PIPE, text=True)
    try:
        lines = []
        while not (lines and lines[-1].startswith("Ctrl-C")):  # readline returns "" if it exits first
            lines.append(proc.stdout.readline())
            assert lines[-1], f"exited early: {lines}"
        assert lines[0] == f"s3rver is listening on http://127.0.0.1:{port} with bucket 'cli-test'. Use it with:\n"
        options = parse_storage_options(re.findall(r"^  --storage-option (\S+)$", "".join(lines), re.M))
        assert options["endpoint_url"] == f"http://127.0.0.1:{port}"
        fs, path = open_fs("s3://cli-test/hello.bin", options)
        fs.pipe_file(path, b"written through the printed options")
        fs2, _ = open_fs("s3://cli-test/hello.bin", options)
        assert fs2.cat_file(path) == b"written through the printed options"
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children, "no node process"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        _, alive = psutil.wait_procs(children, timeout=10)
        assert alive == [], [p.cmdline() for p in alive]
        assert not port_taken(port)
        assert (tmp_path / "s3" / "data" / "cli-test").is_dir()  # --dir holds the data, kept
    finally:
        if proc.poll() is None:
            proc.kill()


@contextmanager
def socket_listening() -> Iterator[int]:
    """A port on 127.0.0.1 something else listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_taken_port_is_a_clear_error_and_exit_1():
    with socket_listening() as port:
        res = subprocess.run([sys.executable, "-m", "trainfeed.benchmarks.emulators.s3rver", "--bucket", "b",
                              "--port", str(port)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    assert res.stderr == f"error: port {port} on 127.0.0.1 is already in use; choose another (or omit it for a " \
                         "free one)\n"


@pytest.mark.slow
def test_readme_s3_walkthrough_runs_as_written(tmp_path):
    """The README's S3 snippet verbatim, on the `data/vols` the Azurite snippet above it generates."""
    if port_taken(4568):
        pytest.skip("port 4568 (the walkthrough's s3rver) is in use")
    azurite = block("README.md", "bash", "python -m trainfeed.benchmarks.emulators.azurite")
    (generate,) = [line for line in azurite.splitlines() if line.startswith("storage-bench generate")]
    script = block("README.md", "bash", "python -m trainfeed.benchmarks.emulators.s3rver")
    res = run_bash(f"{generate}\n{script}", tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "s3rver is listening on http://127.0.0.1:4568 with bucket 'trainfeed'" in res.stdout
    assert "parquet store written: s3://trainfeed/vols.parquet" in res.stdout
    assert "  samples   200 converted, 0 rejected" in res.stdout
    assert "trained torch on cpu from parquet store s3://trainfeed/vols.parquet" in res.stdout
    assert not port_taken(4568)  # s3rver stopped with the walkthrough
