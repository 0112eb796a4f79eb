"""The formats a store can have, and detection of an existing store's format."""
from __future__ import annotations

from pathlib import Path
from types import ModuleType

from . import delta, hdf5, parquet

FORMATS: dict[str, ModuleType] = {"parquet": parquet, "delta": delta, "hdf5": hdf5}


def detect_format(path) -> str | None:
    """'delta', 'parquet' or 'hdf5' for a trainfeed store at ``path``; None if it is not one."""
    path = Path(path)
    if not path.exists():
        return None
    if delta.is_store(path):
        return "delta"
    if hdf5.is_store(path):
        return "hdf5"
    if parquet.is_store(path):
        return "parquet"
    return None


def module(fmt: str) -> ModuleType:
    return FORMATS[fmt]
