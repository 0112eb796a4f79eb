"""Publish a Parquet or HDF5 store written on local disk to object storage: the data first,
the commit record last.

Object stores have no rename, but a single PUT is atomic: an object appears whole or not at
all. So:

- a folder store (Parquet, sharded HDF5) uploads its parts under names new to this run
  (``part-00000-<run>.parquet``), then writes ``_trainfeed.json``, the manifest that lists
  them. Readers take only the parts a manifest lists, so they see the previous store or the
  new one, never a mix. The parts of the replaced generation (and those a killed run left,
  never listed) are deleted once the new manifest is in place.
- a single-file HDF5 store is one PUT (with ``--verify``: first to a hidden name, checked
  there, then PUT again under its name).

Just before the commit record is written, what is at the destination is checked again: a
create never replaces what appeared meanwhile, an overwrite replaces only a store trainfeed
wrote. A failed ``--verify`` puts the previous manifest back. Concurrent writers to one URL
are not serialized (object stores offer no lock trainfeed could rely on everywhere): the
manifest written last wins, and each run's store is complete.
"""
from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from contextlib import AbstractContextManager, nullcontext, suppress
from pathlib import Path
from typing import Any

from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.formats import registry
from trainfeed.converters.formats.registry import identify
from trainfeed.converters.layout import MANIFEST
from trainfeed.converters.storage.clouds import cloud_for, urlscheme
from trainfeed.converters.storage.location import Location
from trainfeed.converters.storage.upload import Uploader

Check = Callable[[Location], "dict[str, Any] | None"]
#: The publishing step (``SafeInterrupts.publishing``): checks for Ctrl-C / SIGTERM first, then
#: lets the one request that publishes complete.
Publishing = Callable[[], AbstractContextManager[object]]


def uploader(dst: Location, staged: Path) -> Uploader:
    """Uploads a folder store's parts under run-tagged names as the writer completes them."""
    run = uuid.uuid4().hex[:8]
    return Uploader(dst, staged, rename=lambda name: _tagged(name, run))


def publish(staged: Path, dst: Location, overwrite: bool, verify: Check | None, parts: Uploader,
            publishing: Publishing = nullcontext) -> tuple[list[str], dict[str, Any] | None]:
    """Publish the store written at ``staged`` (a folder store's parts uploaded by ``parts``)
    at ``dst``; returns (data file URLs, what ``verify`` said). ``publishing()`` wraps the one
    request that publishes, after every upload has finished: a Ctrl-C that arrived while the
    last parts were still uploading is acted on there, before anything is published."""
    if staged.is_file():
        return _publish_file(staged, dst, overwrite, verify, publishing)
    return _publish_folder(staged, dst, overwrite, verify, parts.finish(), publishing)


def _names(dst: Location) -> set[str]:
    """Names of the objects directly under ``dst`` (the object itself if it is one)."""
    try:
        if not dst.fs.isdir(dst.path):
            return {dst.name} if dst.fs.exists(dst.path) else set()
        return set(dst.names())
    except FileNotFoundError:
        return set()


def _recheck(dst: Location, overwrite: bool, ours: AbstractSet[str] = frozenset()) -> bytes | None:
    """What is at ``dst`` now, besides this run's own parts, must still be what this run may
    replace. Returns the manifest in place (put back if the new store fails its check)."""
    if not _names(dst) - ours:
        return None
    found = identify(dst)
    if found is not None and found.leftovers:
        return None  # only what killed runs left: removed once this store is committed
    if not overwrite or found is None or not found.replaceable:
        what = found.what if found else "new objects"
        raise TrainfeedError(f"{dst.shown}: the destination changed while this run was writing ({what}); "
                             "leaving it untouched, nothing published")
    manifested = found.format is None or found.format.commit_record == MANIFEST  # not a log's table
    return dst.read_bytes(MANIFEST) if manifested and dst.exists(MANIFEST) else None


def _publish_folder(staged: Path, dst: Location, overwrite: bool, verify: Check | None, renamed: dict[str, str],
                    publishing: Publishing = nullcontext) -> tuple[list[str], dict[str, Any] | None]:
    manifest = json.loads((staged / MANIFEST).read_text())
    manifest["parts"] = [{**p, "file": renamed[p["file"]]} for p in manifest["parts"]]
    new = list(renamed.values())
    try:
        previous = _recheck(dst, overwrite, set(new))
        with publishing():
            dst.fs.pipe_file(dst.file(MANIFEST), json.dumps(manifest, indent=1).encode())
    except BaseException:
        remove(dst, new)
        raise
    try:
        verified = verify(dst) if verify else None
    except BaseException:
        if previous is None:
            remove(dst, [MANIFEST])
        else:
            dst.fs.pipe_file(dst.file(MANIFEST), previous)
        remove(dst, new)
        raise
    remove_stale(dst, keep=set(new) | {MANIFEST})
    return [dst.url_of(n) for n in new], verified


def _publish_file(staged: Path, dst: Location, overwrite: bool, verify: Check | None,
                  publishing: Publishing = nullcontext) -> tuple[list[str], dict[str, Any] | None]:
    verified: dict[str, Any] | None = None
    if verify is not None:
        hidden = f"{TRIAL}{uuid.uuid4().hex[:8]}"
        trial = Location(dst.url + hidden, dst.fs, dst.path + hidden, dst.storage_options)
        try:
            trial.fs.put_file(str(staged), trial.path)
            verified = verify(trial)
        finally:
            with suppress(Exception):
                trial.fs.rm_file(trial.path)
    _recheck(dst, overwrite)
    with publishing():
        dst.fs.put_file(str(staged), dst.path)
    return [dst.url], verified


def _tagged(name: str, run: str) -> str:
    """``part-00000.parquet`` -> ``part-00000-<run>.parquet``: the names each format's
    ``run_part_names`` matches (registry.RUN_PART: what a killed run left)."""
    stem, dot, suffix = name.rpartition(".")
    return f"{stem}-{run}{dot}{suffix}"


def remove(dst: Location, names: list[str]) -> None:
    """Best effort: what stays is never listed by a manifest or a commit, and the next run to
    this destination removes it."""
    with suppress(Exception):
        existing = [dst.file(n) for n in names if dst.exists(n)]
        if existing:
            dst.fs.rm(existing, recursive=True)


def remove_stale(dst: Location, keep: set[str]) -> None:
    """In a folder that is trainfeed's, delete the data files, manifest and Delta log that the
    store now at ``dst`` does not use (the replaced generation or layout, a killed run's
    leftovers); ``keep``: the names it uses. Only names trainfeed writes are touched."""
    remove(dst, [n for n in _names(dst) - keep if registry.PART.fullmatch(n) or n in registry.COMMIT_RECORDS])


#: An HDF5 file's ``--verify`` trial copy: ``DST.trainfeed-tmp-<run>``, beside DST.
TRIAL = ".trainfeed-tmp-"


def remove_leftovers(dst: Location) -> None:
    """Once a store is published at ``dst`` (on object storage): delete what trainfeed's
    earlier runs there left and no reader can see, recognised by trainfeed's own names only:
    ``--verify`` trial copies beside DST (``DST.trainfeed-tmp-<run>``, a run killed while it
    checked one) and, on Azure, blobs with uncommitted blocks only (a run killed in the middle
    of a block upload) named like its run-tagged parts or trials. Best effort."""
    if dst.local:
        return
    trial = re.compile(re.escape(dst.name + TRIAL) + r"[0-9a-f]{8}")
    with suppress(Exception):
        parent = dst.path.rsplit("/", 1)[0] if "/" in dst.path else dst.path
        found = [p for p in dst.fs.ls(parent, detail=False) if trial.fullmatch(p.rstrip("/").rsplit("/", 1)[-1])]
        if found:
            dst.fs.rm(found)
    with suppress(Exception):
        _remove_uncommitted_blobs(dst, trial)


def _remove_uncommitted_blobs(dst: Location, trial: re.Pattern[str]) -> None:
    """What a killed upload left under DST that no listing shows (Azure's uncommitted blocks:
    the cloud's ``remove_uncommitted``), for the names of its run-tagged parts and trials only."""
    cloud = cloud_for(urlscheme(dst.url))
    if cloud is None or "/" not in dst.path:
        return
    prefix = dst.path.split("/", 1)[1]

    def ours(name: str) -> bool:
        rest = name[len(prefix):]
        left_by_a_run = rest.startswith("/") and registry.RUN_PART.fullmatch(rest[1:])
        return bool(left_by_a_run or trial.fullmatch(name.rsplit("/", 1)[-1]))

    cloud.remove_uncommitted(dst, ours)
