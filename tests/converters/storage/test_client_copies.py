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


FORK_PROBE = """
import gc, os
from trainfeed.converters.storage import client
client.library()  # this process uses the installed library (its runtime)
pid = os.fork()
if pid == 0:
    os._exit(0 if gc.get_freeze_count() > 0 else 3)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), gc.get_freeze_count())
"""


def test_a_fork_freezes_the_parents_garbage_for_the_child_only():
    """A forked child never collects what its parent had not: freeing a leftover cycle holding a
    store would call the runtime the child inherited without its threads (a DataLoader worker hung
    inside another library's fork hook that way). The parent collects as before once forked."""
    res = subprocess.run([sys.executable, "-c", FORK_PROBE], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["0", "0"]  # the child's objects frozen; the parent's unfrozen again


CACHE_PROBE = """
import os
from trainfeed.converters.storage import native
held = object()
native.NativeFileSystem._cache["a file system"] = held  # as fsspec caches an instance
pid = os.fork()
if pid == 0:
    native.NativeFileSystem._cache.clear()  # what fsspec's own fork hook does in the child
    os._exit(0 if native._held_at_fork == [held] else 3)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), len(native._held_at_fork))
"""


def test_file_systems_fsspec_drops_in_a_forked_child_are_held_there():
    """fsspec empties its instance cache in a forked child; a cached native file system must not
    be freed there (its client would call the inherited runtime): the child holds it, the parent
    lets go after the fork."""
    res = subprocess.run([sys.executable, "-c", CACHE_PROBE], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["0", "0"]
