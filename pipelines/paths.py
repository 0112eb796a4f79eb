"""One spelling per location, so that the paths Spark hands executors match the user's.

Spark qualifies what it lists: a local ``/data/vols`` comes back as ``file:/data/vols/x.npy``,
a Unity Catalog volume ``/Volumes/c/s/v`` as ``dbfs:/Volumes/c/s/v/x.npy``, and the FUSE view
``/dbfs/mnt/x`` is ``dbfs:/mnt/x`` to Spark. A sample's id is its path relative to the source
folder, so both sides are brought to the same form before the relative path is taken.
"""
from __future__ import annotations

import os
import posixpath

_SCHEMELESS_PREFIXES = ("file:", "dbfs:")


def canonical(path: str) -> str:
    """``file:``/``file://`` dropped, ``dbfs:/x`` and ``/dbfs/x`` both ``/x`` (``/Volumes/...``
    stays), a cloud URL as ``authority/path`` (``abfss://c@a.dfs.core.windows.net/p`` ->
    ``c@a.dfs.core.windows.net/p``); no trailing slash."""
    if path.startswith("file://"):
        path = path[len("file://"):]
    elif path.startswith(_SCHEMELESS_PREFIXES):
        path = path.split(":", 1)[1]
    elif "://" in path:
        path = path.split("://", 1)[1]
    if path == "/dbfs" or path.startswith("/dbfs/"):
        path = path[len("/dbfs"):] or "/"
    return posixpath.normpath(path) if path.startswith("/") else path.rstrip("/")


def source_root(src: str) -> str:
    """The canonical form of a source folder as the user named it (a relative local path is
    made absolute on the driver: executors see absolute paths)."""
    local = "://" not in src and not src.startswith(_SCHEMELESS_PREFIXES)
    return canonical(os.path.abspath(src) if local else src)


def sample_id(path: str, root: str) -> str:
    """The id of the file Spark lists at ``path`` under the canonical source ``root``."""
    return posixpath.splitext(posixpath.relpath(canonical(path), root))[0]
