"""Databricks paths in the two spellings the job needs.

The driver and the executors read files with ordinary file APIs, where DBFS is the FUSE
mount ``/dbfs`` and a Unity Catalog volume is ``/Volumes/...`` (mounted on every node of a
dedicated cluster); Spark's readers and writers take ``dbfs:/...`` instead of ``/dbfs/...``.
Sample ids are paths relative to the source folder as the driver lists it, so they are the
ids ``convert`` gives the same files, whichever spelling the user typed.
"""
from __future__ import annotations

_DBFS_FUSE = "/dbfs"


def fuse_path(location: str) -> str:
    """A ``dbfs:`` URL as the file path every node reads it at (``dbfs:/Volumes/c/s/v`` ->
    ``/Volumes/c/s/v``, ``dbfs:/mnt/x`` -> ``/dbfs/mnt/x``); anything else unchanged."""
    if not location.startswith("dbfs:"):
        return location
    path = "/" + location[len("dbfs:"):].lstrip("/")
    return path if path == "/Volumes" or path.startswith("/Volumes/") else _DBFS_FUSE + path.rstrip("/")


def spark_path(path: str) -> str:
    """A file path as Spark takes it: the FUSE view ``/dbfs/x`` is ``dbfs:/x`` to Spark;
    volume paths and local paths are unchanged."""
    if path == _DBFS_FUSE or path.startswith(_DBFS_FUSE + "/"):
        return "dbfs:" + (path[len(_DBFS_FUSE):] or "/")
    return path
