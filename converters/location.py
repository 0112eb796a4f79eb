"""Where a store lives: a local path or an fsspec URL (abfs://, az://, abfss://, s3://, gs://,
file://) with its storage options, resolved once.

Everything trainfeed reads or writes on object storage goes through a ``Location``: fsspec
for data files and manifests, and, for Delta tables, delta-rs with the same credentials
translated to its own option names (``delta_options``). A wrapper filesystem (the benchmarks'
latency emulation) exposes ``inner_url(path)`` and ``inner_options`` so that delta-rs can
reach the storage underneath it.
"""
from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import fsspec

from .redact import redact_url
from .sources import CALL_TIMEOUT, is_local, open_fs

AZURE = ("abfs", "abfss", "az")
S3 = ("s3", "s3a")
GCS = ("gs", "gcs")


def is_remote(url) -> bool:
    """Whether ``url`` names object storage (or any fsspec filesystem) rather than a local path."""
    text = str(url)
    return "://" in text and not text.startswith("file://")


@dataclass(frozen=True)
class Location:
    url: str  # as given; may carry secrets (show ``shown``)
    fs: fsspec.AbstractFileSystem
    path: str  # inside ``fs``, without a trailing slash
    storage_options: dict = field(default_factory=dict)

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

    def child(self, name: str) -> "Location":
        return Location(self.url_of(name), self.fs, self.file(name), self.storage_options)

    def exists(self, name: str = "") -> bool:
        return self.fs.exists(self.file(name) if name else self.path)

    def is_file(self) -> bool:
        return self.fs.isfile(self.path)

    def read_bytes(self, name: str) -> bytes:
        """The whole of ``name`` in this folder; FileNotFoundError if it is not there."""
        return self.fs.cat_file(self.file(name))

    def names(self) -> list[str]:
        """Names of the entries directly in this folder (one listing request)."""
        return [e.rstrip("/").rsplit("/", 1)[-1] for e in self.fs.ls(self.path, detail=False)]

    def sizes(self) -> dict[str, int]:
        """Size of every object directly in this folder, by path (one listing request)."""
        return {e["name"].rstrip("/"): int(e.get("size") or 0) for e in self.fs.ls(self.path, detail=True)
                if e.get("type") != "directory"}

    def delta_uri(self) -> str:
        """The table URI for delta-rs: the local path, or the URL of the storage itself (a wrapper
        filesystem names the one beneath it)."""
        if self.local:
            return self.path
        inner = getattr(self.fs, "inner_url", None)
        return inner(self.path) if inner else self.url.split("?", 1)[0].rstrip("/")

    def delta_options(self) -> dict[str, str]:
        """``storage_options`` in delta-rs's (object_store's) names."""
        if self.local:
            return {}
        inner = getattr(self.fs, "inner_options", None)
        uri = self.delta_uri()
        return object_store_options(urlsplit(uri).scheme, inner if inner is not None else self.storage_options)


def locate(url, storage_options: dict | None = None) -> Location:
    """The Location of a local path (made absolute) or URL."""
    text = str(url)
    options = dict(storage_options or {})
    if not is_remote(text):
        path = os.path.abspath(text.removeprefix("file://"))
        return Location(path, fsspec.filesystem("file"), path, options)
    fs, path = open_fs(text, options)
    return Location(text, fs, path.rstrip("/"), options)


def as_location(path, storage_options: dict | None = None) -> Location:
    """``path`` if it is a Location already, else ``locate(path, storage_options)``."""
    return path if isinstance(path, Location) else locate(path, storage_options)


# ------------------------------------------------------------------ delta-rs credentials

_AZURE_NAMES = {"account_name": "account_name", "account_key": "account_key", "sas_token": "sas_token",
                "client_id": "client_id", "client_secret": "client_secret", "tenant_id": "tenant_id"}
_S3_NAMES = {"key": "aws_access_key_id", "secret": "aws_secret_access_key", "token": "aws_session_token",
             "endpoint_url": "aws_endpoint_url", "region_name": "aws_region"}


def _connection_string(text: str) -> dict[str, str]:
    parts = dict(p.split("=", 1) for p in text.split(";") if "=" in p)
    out = {"account_name": parts.get("AccountName"), "account_key": parts.get("AccountKey"),
           "sas_token": parts.get("SharedAccessSignature"), "endpoint": parts.get("BlobEndpoint")}
    return {k: v for k, v in out.items() if v}


def object_store_options(scheme: str, options: dict) -> dict[str, str]:
    """fsspec storage options (adlfs, s3fs names) as delta-rs takes them. Options already in
    delta-rs's names (``azure_storage_*``, ``aws_*``, ``google_*``) pass through unchanged;
    trainfeed's own (``call_timeout``) are dropped. Environment variables are read by both
    libraries themselves."""
    out: dict[str, str] = {}
    for key, value in options.items():
        if key == CALL_TIMEOUT or value is None:
            continue
        if key.startswith(("azure_", "aws_", "google_")) or key in ("allow_http", "endpoint"):
            out[key] = str(value)
        elif scheme in AZURE and key == "connection_string":
            out.update(_connection_string(str(value)))
        elif scheme in AZURE and key in _AZURE_NAMES:
            out[_AZURE_NAMES[key]] = str(value)
        elif scheme in S3 and key in _S3_NAMES:
            out[_S3_NAMES[key]] = str(value)
        elif scheme in S3 and key == "client_kwargs" and isinstance(value, dict):
            out.update({_S3_NAMES[k]: str(v) for k, v in value.items() if k in _S3_NAMES})
        elif scheme in GCS and key == "token" and isinstance(value, str) and os.path.isfile(value):
            out["google_service_account"] = value
    if scheme in AZURE and not out and os.environ.get("AZURE_STORAGE_CONNECTION_STRING"):
        # adlfs reads this variable itself; delta-rs does not
        out.update(_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"]))
    endpoint = out.get("endpoint") or out.get("aws_endpoint_url") or ""
    if endpoint.startswith("http://"):
        out["allow_http"] = "true"
    if scheme in S3:
        # S3 has no atomic rename: delta-rs commits with conditional writes (If-None-Match),
        # which S3 has supported since 2024, so two writers can never both commit a version.
        out.setdefault("conditional_put", "etag")
    return out
