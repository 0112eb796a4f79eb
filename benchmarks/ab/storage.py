"""Where the A/B matrix keeps its stores: one storage backend for every store, the small files
included, so that the layout is the only difference between the cells it compares.

A backend is local disk (OUT/stores), Azurite (a real Azure Blob endpoint on loopback, started
for the run) or any fsspec URL. Every store is staged there (the small files copied when they
are not there already, the compacted stores written by trainfeed's own ``convert``) and every
cell reads it from there, through the latency emulation (``emulated://``) when a profile is set.
"""
from __future__ import annotations

import os
import posixpath
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fsspec import AbstractFileSystem

from trainfeed.benchmarks.ab.storagesim import EMULATED  # importing it registers emulated:// with fsspec
from trainfeed.converters.convert import ConvertConfig, convert
from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.formats.options import WriteOptions
from trainfeed.converters.formats.registry import FORMATS
from trainfeed.converters.redact import redact_url, register_storage_options
from trainfeed.converters.sources.decode import ArrayOptions, ImageOptions
from trainfeed.converters.storage.clouds import cloud_for
from trainfeed.converters.storage.filesystems import is_local, open_fs
from trainfeed.converters.storage.location import is_remote

#: The folder (under the backend's root) of the small files when they have to be copied there.
SMALL_FILES = "small-files"
#: Azurite's container for the staged stores.
CONTAINER = "trainfeed"
COPY_THREADS = 16


@dataclass(frozen=True)
class StoreSource:
    """Where a cell reads one store from, and how."""

    path: str
    storage_options: dict[str, Any]
    fmt: str | None = None  # None: detected from the path
    labels_csv: str | None = None  # blob: the labels CSV, reached the way the files are


@dataclass(frozen=True)
class Backend:
    """The storage every store of one matrix is staged on and read from."""

    kind: str  # "local", "azurite", or the URL's protocol (abfs, s3, ...)
    root: str  # local folder or URL under which the stores are staged
    options: dict[str, Any] = field(default_factory=dict)  # storage options for ``root``
    profile: str | None = None  # latency emulation every read goes through; None: as is

    @property
    def protocol(self) -> str:
        return protocol_of(self.root)

    def url(self, name: str) -> str:
        return posixpath.join(self.root, name)

    def on(self, url: str) -> bool:
        """Whether ``url`` is on this kind of storage (reached with the same options)."""
        return _family(protocol_of(url)) == _family(self.protocol)

    def holds(self, url: str) -> bool:
        """Whether ``url`` is already there (an Azurite started for the run holds nothing yet)."""
        return self.kind != "azurite" and self.on(url)

    def describe(self, url: str) -> dict[str, str | None]:
        """What a cell records of where it read from (no secrets: the URL without its query)."""
        return {"backend": self.kind, "url": url if self.kind == "local" else redact_url(url),
                "profile": self.profile}

    def source(self, url: str, fmt: str, labels_csv: str | None = None) -> StoreSource:
        """``url`` (on this backend) as the cells read it: through the latency emulation when a
        profile is set (``emulated://``, whose options hold the backend's own)."""
        if not self.profile:
            return StoreSource(url, dict(self.options), fmt, labels_csv)

        opts = {"target": self.protocol, "profile": self.profile, "target_options": dict(self.options)}
        return StoreSource(f"{EMULATED}://{path_of(url)}", opts, fmt, self._emulated_labels(labels_csv))

    def _emulated_labels(self, labels_csv: str | None) -> str | None:
        """A labels CSV on this storage is read through the emulation, as the files are; one
        elsewhere (a local file beside remote stores) as it is."""
        if labels_csv is None or not self.on(labels_csv):
            return labels_csv
        return f"{EMULATED}://{path_of(labels_csv)}"


def protocol_of(url: str) -> str:
    return url.split("://", 1)[0] if is_remote(url) else "file"


def _family(protocol: str) -> str:
    """abfs, abfss and az name one storage (Azure Blob / ADLS), s3 and s3a another: one cloud."""
    cloud = cloud_for(protocol)
    return cloud.name if cloud is not None else protocol


def path_of(url: str) -> str:
    """The path of a local path or URL inside its filesystem (local: absolute)."""
    return url.split("://", 1)[1].split("?", 1)[0] if is_remote(url) else os.path.abspath(url.removeprefix("file://"))


def plan_backend(spec: str, out: Path, options: dict[str, Any], profile: str | None) -> Backend:
    """``--storage-backend``: local (OUT/stores), azurite (started by ``open_backend``) or a URL
    (with ``options``, the --storage-option pairs)."""
    if spec == "local":
        return Backend("local", os.path.abspath(os.path.join(out, "stores")), {}, profile)
    if spec == "azurite":
        return Backend("azurite", f"abfs://{CONTAINER}/stores", {}, profile)
    if is_remote(spec) and "?" not in spec:
        return Backend(protocol_of(spec), spec.rstrip("/"), dict(options), profile)
    raise UsageError(f"--storage-backend {redact_url(spec)}: choose local, azurite, or a URL such as "
                     "abfs://container/folder (credentials go in --storage-option, not in the URL)")


@contextmanager
def open_backend(backend: Backend, log: Callable[[str], None]) -> Iterator[Backend]:
    """The backend, ready: for azurite, a server started here (and stopped on exit)."""
    if backend.kind != "azurite":
        yield backend
        return
    from trainfeed.benchmarks.emulators import azurite

    try:
        server = azurite.start()
    except azurite.AzuriteError as exc:
        raise TrainfeedError(str(exc)) from exc
    register_storage_options(server.storage_options)
    log(f"storage: Azurite (Azure Blob API) on 127.0.0.1:{server.port}, container {CONTAINER}")
    try:
        server.create_container(CONTAINER)
        yield replace(backend, options=server.storage_options)
    finally:
        server.stop()


def check_labels(labels_csv: str | None, src: str, backend: Backend) -> None:
    """The labels must be reachable with the backend's options: inside SRC (they are staged
    with it), a local file, or on the backend's storage."""
    if labels_csv is None or _inside(labels_csv, src) or not is_remote(labels_csv) or backend.holds(labels_csv):
        return
    raise UsageError(f"--labels {labels_csv}: must be a local file, inside SRC, or on the storage backend "
                     f"({backend.kind}); copy it there")


def _inside(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip("/") + "/")


def stage_small_files(src: str, labels_csv: str | None, src_options: dict[str, Any], backend: Backend,
                      log: Callable[[str], None]) -> tuple[str, str | None]:
    """The small files on the backend: SRC itself when it is there, else a copy of it (the
    labels CSV follows when it is inside SRC). Returns (their URL, the labels CSV's)."""
    if backend.holds(src):
        log(f"stage small files: already on {backend.kind}: {src}")
        return src, labels_csv
    dst = backend.url(SMALL_FILES)
    log(f"stage small files: copying {src} -> {dst}")
    t0 = time.perf_counter()
    files, nbytes = copy_tree(src, src_options, dst, backend.options)
    log(f"stage small files: {files:,} files, {nbytes / 1e6:,.1f} MB in {time.perf_counter() - t0:.1f} s")
    if labels_csv and _inside(labels_csv, src):
        labels_csv = posixpath.join(dst, labels_csv[len(src.rstrip("/")) + 1:])
    return dst, labels_csv


def stage_store(fmt: str, small_files: str, labels_csv: str | None, backend: Backend,
                log: Callable[[str], None], name: str | None = None, image: ImageOptions | None = None,
                arrays: ArrayOptions | None = None) -> str:
    """Convert the small files (on the backend) into a ``fmt`` store beside them, named
    ``name`` (default: the format), images as ``image`` says (``convert --resize
    --image-storage``), arrays as ``arrays`` says (``--ragged --dtype --channels``); its URL.
    A format whose store may be one file (HDF5) is staged as one."""
    name = name or fmt
    single = FORMATS[fmt].single_file
    dst = backend.url(name + FORMATS[fmt].suffixes[0] if single else name)
    log(f"stage {name}: converting {small_files} -> {dst}")
    t0 = time.perf_counter()
    summary = convert(ConvertConfig(src=small_files, dst=dst, fmt=fmt, labels_csv=labels_csv,
                                    storage_options=backend.options,
                                    write=WriteOptions(row_group_size=8 * 10**6, mode="overwrite"),
                                    image=image or ImageOptions(), arrays=arrays or ArrayOptions(),
                                    workers=max(2, os.cpu_count() or 2)))
    log(f"stage {name}: {summary['samples']:,} samples, {summary['files_out']} files, "
        f"{summary['bytes_out'] / 1e6:,.1f} MB in {time.perf_counter() - t0:.1f} s")
    return dst


def local_copy(url: str, backend: Backend, dest: Path) -> str:
    """A store on local disk, read as it is: the store itself on the local backend, else a
    copy of it downloaded to ``dest``."""
    if backend.kind == "local":
        return url
    copy_tree(url, backend.options, str(dest), {})
    return str(dest)


def copy_tree(src: str, src_options: dict[str, Any], dst: str, dst_options: dict[str, Any]) -> tuple[int, int]:
    """Copy a folder (or one file) from one storage to another, replacing what ``dst`` held;
    returns (files, bytes)."""
    sfs, sroot = open_fs(src, src_options)
    dfs, droot = open_fs(dst, dst_options)
    try:
        files = sfs.find(sroot) if sfs.isdir(sroot) else [sroot] if sfs.isfile(sroot) else []
        if not files:
            raise TrainfeedError(f"{src}: not found, or an empty folder")
        if dfs.exists(droot):
            dfs.rm(droot, recursive=True)
        with ThreadPoolExecutor(COPY_THREADS) as pool:
            return len(files), sum(pool.map(lambda path: _copy_file(sfs, sroot, path, dfs, droot), files))
    except TrainfeedError:
        raise
    except Exception as exc:  # remote stores raise their own types
        raise TrainfeedError(f"{src}: cannot copy to {dst}: {exc}") from exc


def _copy_file(sfs: AbstractFileSystem, sroot: str, path: str, dfs: AbstractFileSystem, droot: str) -> int:
    rel = posixpath.relpath(path, sroot)
    target = droot if rel == "." else posixpath.join(droot, rel)
    data: bytes = sfs.cat_file(path)
    if is_local(dfs):
        dfs.makedirs(posixpath.dirname(target), exist_ok=True)
    dfs.pipe_file(target, data)
    return len(data)

