"""Killing a real conversion at any moment leaves the previous state or the complete new
store, never a partial one that a reader would accept."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import write_volumes
from trainfeed.converters.formats import delta, hdf5, parquet
from trainfeed.converters.formats.registry import detect_format

READERS = {"parquet": parquet, "delta": delta, "hdf5": hdf5}
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def big_source(tmp_path_factory):
    """~70 MB of reference-shaped volumes: long enough to kill part-way."""
    src = tmp_path_factory.mktemp("big") / "vols"
    truth = write_volumes(src, 200, shape=(30, 30, 10, 10), labels_csv=False)
    return src, truth


def start_convert(src: Path, dst: Path, fmt: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "trainfeed.converters", str(src), str(dst), "--to", fmt, "--no-progress",
           "--workers", "1", "--row-group-size", "400KB", "--target-file-size", "2MB", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for_partial_output(parent: Path, name: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Until the run has written some data files (in its staging folder or in the table)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"convert finished before it could be killed: {proc.stderr.read().decode()}")
        written = [p for p in parent.glob(f"*{name}*/*") if p.suffix in (".parquet", ".h5")]
        if len(written) >= 2:
            return
        time.sleep(0.005)
    pytest.fail("convert wrote nothing in time")


def read_all(fmt: str, path: Path) -> dict:
    return {sid: f["volume"] for sid, _, f in READERS[fmt].read_samples(path)}


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("fmt,name", [("parquet", "new.parquet"), ("delta", "new.delta"), ("hdf5", "new_shards")])
def test_killed_new_store_is_never_visible(tmp_path, big_source, fmt, name, sig):
    src, truth = big_source
    dst = tmp_path / name
    proc = start_convert(src, dst, fmt)
    wait_for_partial_output(tmp_path, name, proc)
    proc.send_signal(sig)
    code = proc.wait(30)
    assert code == {signal.SIGINT: 130, signal.SIGTERM: 143}.get(sig, -9)
    assert not dst.exists() and detect_format(dst) is None
    if sig != signal.SIGKILL:  # clean exit, one line: staging removed at once
        lines = proc.stderr.read().decode().strip().splitlines()
        assert len(lines) == 1 and "nothing was published" in lines[0], lines
        assert [p.name for p in tmp_path.iterdir()] == []
    # The next run cleans up whatever a SIGKILL left, and completes.
    done = subprocess.run([sys.executable, "-m", "trainfeed.converters", str(src), str(dst), "--to", fmt,
                           "--no-progress"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert [p.name for p in tmp_path.iterdir()] == [name]
    got = read_all(fmt, dst)
    assert set(got) == set(truth) and all(np.array_equal(got[k], truth[k][0]) for k in truth)


@pytest.mark.parametrize("fmt,name", [("parquet", "old.parquet"), ("delta", "old.delta"), ("hdf5", "old.h5")])
def test_killed_overwrite_keeps_the_old_store(tmp_path, big_source, fmt, name):
    src, _truth = big_source
    small = tmp_path / "small"
    small_truth = write_volumes(small, 5, shape=(30, 30, 10, 10), seed=9, labels_csv=False)
    dst = tmp_path / name
    first = subprocess.run([sys.executable, "-m", "trainfeed.converters", str(small), str(dst), "--to", fmt,
                            "--no-progress"],
                           capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    proc = start_convert(src, dst, fmt, "--overwrite")
    if fmt == "hdf5":  # a single file: wait for its staging copy to grow
        deadline = time.monotonic() + 60
        while not any(p.stat().st_size > 5_000_000 for p in tmp_path.glob(f".{name}*")) and time.monotonic() < deadline:
            time.sleep(0.005)
    else:
        wait_for_partial_output(tmp_path, name, proc)
    proc.kill()
    proc.wait(30)
    got = read_all(fmt, dst)
    assert set(got) == set(small_truth)
    assert all(np.array_equal(got[k], small_truth[k][0]) for k in small_truth)


def test_ctrl_c_waits_for_a_safe_point_and_a_second_one_does_not():
    """The first SIGINT only sets a flag (checked between samples); the second interrupts at once."""
    from trainfeed.converters.interrupt import SafeInterrupts

    before = signal.getsignal(signal.SIGINT)  # Python's, or one a library installed (Spark does)
    with SafeInterrupts() as interrupts:
        interrupts.check()  # nothing pressed yet
        signal.raise_signal(signal.SIGINT)  # no KeyboardInterrupt here, inside whatever was running
        with pytest.raises(KeyboardInterrupt):
            interrupts.check()
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


def test_sigterm_is_a_flag_too_and_the_publishing_step_is_never_cut():
    """SIGTERM: checked like Ctrl-C, then ``Interrupted`` (exit 143). Inside ``publishing()``
    a second signal only waits; ``after_publishing`` then says the store is complete."""
    from trainfeed.converters.interrupt import Interrupted, SafeInterrupts

    before = signal.getsignal(signal.SIGTERM)
    with SafeInterrupts() as interrupts:
        signal.raise_signal(signal.SIGTERM)
        with pytest.raises(Interrupted, match="nothing was published") as err:
            interrupts.check()
        assert err.value.exit_code == 143
    with SafeInterrupts() as interrupts:
        with interrupts.publishing():
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)  # a second one: the publishing request still completes
        with pytest.raises(Interrupted, match="complete") as err:
            interrupts.after_publishing("s3://b/store")
        assert err.value.exit_code == 130
    assert signal.getsignal(signal.SIGTERM) is before
