"""Which file system a path or URL opens: local files, the native client for Azure Blob, S3
and GCS, and fsspec for any other URL (``memory://``, ``http://``, a user's own file system).

fsspec stays the interface the rest of trainfeed talks to (listing a folder of small files,
manifests, publishing): one code path for every kind of location. What it costs per byte is
paid only by the native client's own calls (storage/native.py), not by fsspec's async layer.
"""
from __future__ import annotations

from urllib.parse import urlsplit

import fsspec
import fsspec.asyn
from fsspec.implementations.local import LocalFileSystem

from trainfeed.converters.errors import UsageError
from trainfeed.converters.storage.config import AZURE, CALL_TIMEOUT, NATIVE_SCHEMES, call_timeout, parse_url
from trainfeed.converters.storage.native import NativeFileSystem


def open_fs(url: str, storage_options: dict | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """File system and root path for a local path or a URL (abfs://, az://, s3://, gs://, ...),
    checked first (``parse_url``: a UsageError for what cannot mean one place)."""
    url, options = parse_url(url, storage_options)
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    if scheme in NATIVE_SCHEMES:
        host = urlsplit(url).netloc
        left, at, right = host.partition("@")
        account = right.split(".", 1)[0] if scheme in AZURE and at and ":" not in left and "." in right else None
        fs = NativeFileSystem(scheme, {k: v for k, v in options.items() if k != CALL_TIMEOUT},
                              call_timeout(options), account=account)
        return fs, fs._strip_protocol(url)
    options.pop(CALL_TIMEOUT, None)
    try:
        return fsspec.core.url_to_fs(url, **options)
    except (ImportError, ValueError) as exc:
        raise UsageError(f"{url}: cannot open this location: {exc}") from exc


def filesystem(protocol: str, storage_options: dict | None = None) -> fsspec.AbstractFileSystem:
    """The file system of ``protocol`` (``abfs``, ``s3``, ``file``, ...) with these options."""
    return open_fs(f"{protocol}://", storage_options)[0]


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return isinstance(fs, LocalFileSystem)


def call(fs: fsspec.AbstractFileSystem, method: str, *args, deadline: float | None = None, **kwargs):
    """``fs.method(*args, **kwargs)``; on an async fsspec file system (http, a user's) limited to
    ``deadline`` seconds by fsspec's own time limit, which cancels the call and its retries.
    The native client holds its own limit (``call_timeout``)."""
    if deadline and getattr(fs, "async_impl", False):
        return fsspec.asyn.sync(fs.loop, getattr(fs, f"_{method}"), *args, timeout=deadline, **kwargs)
    return getattr(fs, method)(*args, **kwargs)
