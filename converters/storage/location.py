"""Where a store lives: a local path or an fsspec URL (abfs://, az://, abfss://, s3://, gs://,
file://) with its storage options, resolved once.

Everything trainfeed reads or writes on object storage goes through a ``Location``: its file
system (the native client for Azure Blob, S3 and GCS, fsspec for other URLs: see
``storage/``) for data files and manifests, and, for Delta tables, delta-rs with the same
credentials in object_store's option names (``delta_options``). A wrapper filesystem (the benchmarks'
latency emulation) exposes ``inner_url(path)`` and ``inner_options`` so that delta-rs can
reach the storage underneath it.

Every path or URL a user gives goes through one parser (``config.parse_url``, called by
``is_remote``, ``locate``, ``open_fs`` and, before any work, ``convert``), so that a URL means
one place:

- ``s3:/bucket/x`` or ``abfs:container/x`` (a storage scheme without ``//``) is an error
  naming the fix, never a local folder ``./s3:``;
- the bucket (container) must be a bare name: a space, ``%``, ``?``, ``#`` or any other
  character a host cannot hold is an error (object_store would panic on it);
- an object storage URL is taken literally up to a ``?`` or ``#``, which are refused: the
  part after them would be a query or fragment to one client and part of the object name
  to another (a Delta table's log and data under two prefixes). The one exception is an
  Azure SAS token (``?sv=...&sig=...``): it is moved into the storage options
  (``sas_token``), never part of an object name, never printed;
- ``%`` in a key is a literal ``%`` (what the native client stores); in a Delta table's URL
  it is refused (``check_delta_url``), as delta-rs decodes ``%XX`` (a table's log and data
  would be under two prefixes).
"""
from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import fsspec

from trainfeed.converters.errors import UsageError
from trainfeed.converters.redact import redact_url
from trainfeed.converters.storage.clouds import StorageOptions
from trainfeed.converters.storage.config import object_store_options, parse_url, scheme_without_slashes
from trainfeed.converters.storage.filesystems import is_local, open_fs
from trainfeed.converters.storage.native import Identity


def check_delta_url(url: object) -> None:
    """UsageError for a Delta table URL holding ``%``: delta-rs reads ``%XX`` as an escape (and
    not always once), the object client as the characters themselves, so the log and the
    data would land under two prefixes."""
    text = parse_url(url)[0]  # without a SAS token
    if is_remote(text) and "%" in text.split("://", 1)[1]:
        raise UsageError(f"{redact_url(text)}: '%' in a Delta table URL: delta-rs reads %XX as an escape, the "
                         "object client as a name, so the table's log and data would be in two places; choose a "
                         "name without '%'")


def check_url(url: object) -> None:
    """``parse_url`` for its errors only: a path or URL checked before any work."""
    if url is not None:
        parse_url(url)


def is_remote(url: object) -> bool:
    """Whether ``url`` names object storage (or any fsspec filesystem) rather than a local path.
    ``s3:/bucket`` (a storage scheme without ``//``) is a UsageError, never a local path."""
    text = str(url)
    if "://" not in text:
        scheme_without_slashes(text)
        return False
    return not text.startswith("file://")


@dataclass(frozen=True)
class Location:
    url: str  # as given; may carry secrets (show ``shown``)
    fs: fsspec.AbstractFileSystem
    path: str  # inside ``fs``, without a trailing slash
    storage_options: dict[str, Any] = field(default_factory=dict)

    @property
    def local(self) -> bool:
        return is_local(self.fs)

    @property
    def shown(self) -> str:
        """The location as messages show it: a local path, or the URL without secrets."""
        return self.path if self.local else redact_url(self.url)

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)

    def file(self, name: str) -> str:
        """The path (inside ``fs``) of ``name`` in this folder."""
        return posixpath.join(self.path, name)

    def url_of(self, name: str) -> str:
        """The URL of ``name`` in this folder, as the user spelled the location."""
        return self.file(name) if self.local else self.url.split("?", 1)[0].rstrip("/") + "/" + name

    def child(self, name: str) -> Location:
        return Location(self.url_of(name), self.fs, self.file(name), self.storage_options)

    def exists(self, name: str = "") -> bool:
        return bool(self.fs.exists(self.file(name) if name else self.path))

    def is_file(self) -> bool:
        return bool(self.fs.isfile(self.path))

    def read_bytes(self, name: str) -> bytes:
        """The whole of ``name`` in this folder; FileNotFoundError if it is not there."""
        return bytes(self.fs.cat_file(self.file(name)))

    def names(self) -> list[str]:
        """Names of the entries directly in this folder (one listing request)."""
        return [e.rstrip("/").rsplit("/", 1)[-1] for e in self.fs.ls(self.path, detail=False)]

    def objects(self) -> dict[str, Identity]:
        """Version (ETag, size, last modified) of every object directly in this folder, by path
        (one listing request): what a reader's requests and cached ranges are tied to."""
        return {e["name"].rstrip("/"): Identity.of(e) for e in self.fs.ls(self.path, detail=True)
                if e.get("type") != "directory"}

    def identity(self) -> Identity:
        """Version of the object at this location."""
        return Identity.of(self.fs.info(self.path))

    def delta_uri(self) -> str:
        """The table URI for delta-rs: the local path, or the URL of the storage itself (a wrapper
        filesystem names the one beneath it)."""
        if self.local:
            return self.path
        inner = getattr(self.fs, "inner_url", None)
        if inner:
            return str(inner(self.path))
        check_delta_url(self.url)
        return self.url.split("?", 1)[0].rstrip("/")

    def delta_options(self) -> dict[str, str]:
        """``storage_options`` in delta-rs's (object_store's) names."""
        if self.local:
            return {}
        inner = getattr(self.fs, "inner_options", None)
        uri = self.delta_uri()
        return object_store_options(urlsplit(uri).scheme, inner if inner is not None else self.storage_options)


def locate(url: object, storage_options: StorageOptions | None = None) -> Location:
    """The Location of a local path (made absolute) or URL."""
    text, options = parse_url(url, storage_options)
    if not is_remote(text):
        path = os.path.abspath(text.removeprefix("file://"))
        return Location(path, fsspec.filesystem("file"), path, options)
    fs, path = open_fs(text, options)
    return Location(text, fs, path.rstrip("/"), options)


def as_location(path: object, storage_options: StorageOptions | None = None) -> Location:
    """``path`` if it is a Location already, else ``locate(path, storage_options)``."""
    return path if isinstance(path, Location) else locate(path, storage_options)
