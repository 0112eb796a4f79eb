"""The folders of obstore's private copies (converters/storage/client.py): a process killed while
loading one leaves its folder; the next load removes it, and nothing else."""
from __future__ import annotations

import os
import subprocess
import sys

from trainfeed.converters.storage import client


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_killed_loaders_copy_is_swept_and_nothing_else(tmp_path):
    dead, alive = tmp_path / f"trainfeed-obstore-{_dead_pid()}-x1y2", tmp_path / f"trainfeed-obstore-{os.getpid()}-a"
    others = [tmp_path / "trainfeed-obstore-notapid", tmp_path / "user-data"]
    for folder in (dead, alive, *others):
        folder.mkdir()
        (folder / "_obstore.so").write_bytes(b"x" * 100)
    client._sweep_copies(str(tmp_path))
    assert not dead.exists()
    assert alive.exists() and all(f.exists() for f in others)
