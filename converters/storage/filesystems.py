"""Which file system a path or URL opens: local files, the file system of the URL's cloud (the
native client for Azure Blob, S3 and GCS: ``clouds.py``), and fsspec for any other URL
(``memory://``, ``http://``, a user's own file system).

fsspec stays the interface the rest of trainfeed talks to (listing a folder of small files,
manifests, publishing): one code path for every kind of location. What it costs per byte is
paid only by the native client's own calls (storage/native.py), not by fsspec's async layer.
"""
from __future__ import annotations

from typing import Any

import fsspec
import fsspec.asyn
from fsspec.implementations.local import LocalFileSystem

from trainfeed.converters.errors import UsageError
from trainfeed.converters.storage.clouds import StorageOptions, cloud_for, urlscheme
from trainfeed.converters.storage.config import CALL_TIMEOUT, call_timeout, parse_url


def open_fs(url: str, storage_options: StorageOptions | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """File system and root path for a local path or a URL (abfs://, az://, s3://, gs://, ...),
    checked first (``parse_url``: a UsageError for what cannot mean one place)."""
    url, options = parse_url(url, storage_options)
    cloud = cloud_for(urlscheme(url))
    if cloud is not None:
        deadline = call_timeout(options)
        options.pop(CALL_TIMEOUT, None)
        fs = cloud.open(url, options, deadline)
        return fs, str(fs._strip_protocol(url))
    options.pop(CALL_TIMEOUT, None)
    try:
        found: tuple[fsspec.AbstractFileSystem, str] = fsspec.core.url_to_fs(url, **options)
    except (ImportError, ValueError) as exc:
        raise UsageError(f"{url}: cannot open this location: {exc}") from exc
    return found


def filesystem(protocol: str, storage_options: StorageOptions | None = None) -> fsspec.AbstractFileSystem:
    """The file system of ``protocol`` (``abfs``, ``s3``, ``file``, ...) with these options."""
    return open_fs(f"{protocol}://", storage_options)[0]


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return isinstance(fs, LocalFileSystem)


def call(fs: fsspec.AbstractFileSystem, method: str, *args: Any, deadline: float | None = None, **kwargs: Any) -> Any:
    """``fs.method(*args, **kwargs)``; on an async fsspec file system (http, a user's) limited to
    ``deadline`` seconds by fsspec's own time limit, which cancels the call and its retries.
    The native client holds its own limit (``call_timeout``)."""
    if deadline and getattr(fs, "async_impl", False):
        return fsspec.asyn.sync(fs.loop, getattr(fs, f"_{method}"), *args, timeout=deadline, **kwargs)
    return getattr(fs, method)(*args, **kwargs)
