"""Azure Blob, S3 and GCS through obstore (Rust ``object_store``, the client delta-rs uses),
behind fsspec's file system interface.

The hot paths (range reads, uploads) call obstore directly: each request runs in Rust with
the GIL released, and a range arrives as one ``obstore.Bytes`` buffer that readers view
without copying. The rest of trainfeed (listing a folder, manifests, publishing) sees an
ordinary fsspec file system (``NativeFileSystem``), so local paths, these stores and any
other fsspec URL share one code path. Paths are fsspec's: ``bucket/key`` (``container/key``).

Errors become the exceptions fsspec callers already handle: ``FileNotFoundError``,
``PermissionError``, and ``FSTimeoutError`` when the store did not answer within the
``call_timeout`` (retries with backoff included); ``ObjectChanged`` when an object no longer
is the version a reader opened (HTTP 412 on ``If-Match``, or gone).
"""
from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from fsspec.spec import AbstractFileSystem

from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.redact import redact
from trainfeed.converters.storage.client import errors, library
from trainfeed.converters.storage.clouds import ObjectStoreCloud, cloud_for

_T = TypeVar("_T")

#: Bytes per block of a multipart (S3, GCS) or block-blob (Azure) upload, and blocks in flight.
UPLOAD_CHUNK = 16 << 20
UPLOAD_CONCURRENCY = 8


_STATUS = re.compile(r"status code: (\d{3})")
#: Clients a forked process inherited from its parent: never used, never freed (see client.py).
_INHERITED: list[dict[str, object]] = []


class StorageError(TrainfeedError, OSError):
    """The storage kept failing (an error status, retries included): the run cannot go on."""


class AccessDenied(TrainfeedError, PermissionError):
    """The storage refused the credentials (HTTP 401/403), e.g. a token that expired."""


class ObjectChanged(TrainfeedError):
    """An object is no longer the version a reader opened: replaced or deleted meanwhile."""


def changed_message(url: str, how: str = "replaced") -> str:
    return f"{url}: the store changed while it was being read (an object was {how}); reopen it"


@dataclass(frozen=True)
class Identity:
    """Which version of an object: what a cached range and a conditional read are keyed on."""

    size: int
    etag: str | None = None  # without quotes (listings and HEAD spell it differently)
    version: str | None = None
    modified: str | None = None  # ISO time

    @property
    def token(self) -> str:
        return f"{self.etag or ''}|{self.version or ''}|{self.size}|{self.modified or ''}"

    @classmethod
    def of(cls, info: dict[str, Any]) -> Identity:
        """From an fsspec ``info`` / ``ls(detail=True)`` entry, this module's or another file system's."""
        etag = info.get("e_tag") or info.get("ETag") or info.get("etag")
        modified = info.get("last_modified") or info.get("LastModified") or info.get("mtime") \
            or info.get("created")
        if isinstance(modified, datetime):
            modified = modified.isoformat()
        return cls(int(info.get("size") or 0), str(etag).strip('"') if etag else None,
                   info.get("version") or info.get("VersionId"), str(modified) if modified is not None else None)


class NativeFileSystem(AbstractFileSystem):  # type: ignore[misc]  # fsspec is untyped
    """fsspec's interface over one account / endpoint of a cloud the native client serves
    (``clouds.ObjectStoreCloud``: Azure Blob, S3, GCS)."""

    root_marker = ""

    def __init__(self, scheme: str, storage_options: dict[str, Any] | None = None, deadline: float | None = None,
                 account: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        cloud = cloud_for(scheme)
        if not isinstance(cloud, ObjectStoreCloud):
            raise UsageError(f"{scheme}://: not a storage the native client serves")
        self.cloud, self.scheme, self.deadline = cloud, scheme, deadline
        self.protocol = cloud.schemes
        options = dict(storage_options or {})
        if account:  # named in the URL's host (Azure's container@account.host)
            options.setdefault("account_name", account)
        self._settings = cloud.client_settings(options, deadline)
        self._stores: dict[str, object] = {}
        self._pid = os.getpid()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ the stores

    def store(self, bucket: str) -> object:
        """The obstore store of one bucket (container), built once per process and shared by its
        threads (a forked process builds its own: see ``client.py``)."""
        if self._pid != os.getpid():  # forked: the parent's stores and lock are not ours to use
            _INHERITED.append(self._stores)  # kept, never freed here
            self._stores, self._lock, self._pid = {}, threading.Lock(), os.getpid()
        with self._lock:
            store = self._stores.get(bucket)
            if store is None:
                try:
                    store = self.cloud.new_store(library(), bucket, self._settings)
                except errors.BaseError as exc:
                    raise TrainfeedError(redact(f"{self.scheme}://{bucket}: cannot open this storage: "
                                                f"{_first_line(exc)}")) from None
                self._stores[bucket] = store
        return store

    def split(self, path: str) -> tuple[object, str]:
        """(store, key) of an fsspec path ``bucket/key``."""
        bucket, _, key = self._strip_protocol(path).partition("/")
        return self.store(bucket), key

    @classmethod
    def _strip_protocol(cls, path: object) -> str:
        path = str(path)
        if "://" in path:
            path = path.split("://", 1)[1]
        head, _, rest = path.partition("/")
        if "@" in head:
            left, right = head.split("@", 1)
            # user:password@bucket (credentials in the URL: ignored) or
            # abfss://container@account.dfs.core.windows.net/path
            head = right if ":" in left else left
        return f"{head}/{rest}".rstrip("/") if rest else head.rstrip("/")

    def unstrip_protocol(self, name: str) -> str:
        return f"{self.scheme}://{self._strip_protocol(name)}"

    def _run(self, path: str, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """``fn(*args)``, with obstore's errors as fsspec callers expect them."""
        began = time.monotonic()
        try:
            return fn(*args, **kwargs)
        except errors.PreconditionError:
            raise ObjectChanged(changed_message(self.unstrip_protocol(path))) from None
        except FileNotFoundError as exc:
            from trainfeed.converters.storage.config import BucketNotFound, bucket_not_found

            if re.search(r"NoSuchBucket|ContainerNotFound", str(exc)):
                raise BucketNotFound(bucket_not_found(self.unstrip_protocol(path))) from None
            raise FileNotFoundError(f"{self.unstrip_protocol(path)}: not found") from None
        except errors.PermissionDeniedError + errors.UnauthenticatedError + (PermissionError,) as exc:
            raise AccessDenied(f"{self.unstrip_protocol(path)}: access denied: the credentials were refused or "
                               f"have expired ({_first_line(exc)})") from None
        except FileExistsError:
            raise
        except errors.BaseError as exc:
            text = _first_line(exc)
            status = _STATUS.search(text)
            if status is None and "invalid path" in text:  # an answer, naming an object the client cannot hold
                name = re.search(r'Error parsing Path "(.*?)": Encountered', str(exc), re.S)
                raise TrainfeedError(f"{self.unstrip_protocol(path)}: holds an object whose name the storage client "
                                     f"cannot use ({redact(repr(name.group(1))) if name else text}): a control "
                                     "character such as a newline, or an empty path segment; rename or remove "
                                     "that object") from None
            if status is None:  # no answer at all: refused, reset or timed out, retries included
                from trainfeed.converters.storage.config import NoAnswer, no_answer

                raise NoAnswer(f"{no_answer(self.unstrip_protocol(path), self.deadline)} (last: "
                               f"{text.rsplit(' - ', 1)[-1]})") from None
            code, full = status.group(1), str(exc)
            if code == "404":  # not retried: a bucket / container, or a key, that is not there
                from trainfeed.converters.storage.config import BucketNotFound, bucket_not_found

                if re.search(r"NoSuchBucket|ContainerNotFound", full):
                    raise BucketNotFound(bucket_not_found(self.unstrip_protocol(path))) from None
                raise FileNotFoundError(f"{self.unstrip_protocol(path)}: not found (HTTP 404)") from None
            found = re.search(r"<Code>([^<]{1,80})</Code>", full)
            cause = f" ({found.group(1)})" if found else ""
            retried = code.startswith("5") or code in ("408", "429")  # what the client retries with backoff
            limit = f"call_timeout={self.deadline:g} s" if self.deadline else "no call_timeout"
            tail = (f", retried for {time.monotonic() - began:.0f} s ({limit}; --storage-option "
                    "call_timeout=SECONDS sets it)") if retried else ""
            raise StorageError(f"{self.unstrip_protocol(path)}: the storage answered HTTP {code}{cause}{tail}"
                               ) from None

    # ------------------------------------------------------------------ reads

    def get_range(self, path: str, start: int, end: int, identity: Identity | None = None) -> Any:
        """Bytes ``start:end`` as one ``obstore.Bytes`` (a buffer: no copy into Python); with
        ``identity``, only from that version of the object (else ``ObjectChanged``)."""
        store, key = self.split(path)
        if end <= start:
            return b""
        if identity is None or not (identity.etag or identity.version):
            return self._run(path, library().get_range, store, key, start=start, end=end)
        options: dict[str, object] = {"range": (start, end)}
        if identity.etag:
            options["if_match"] = f'"{identity.etag}"'
        if identity.version:
            options["version"] = identity.version
        try:
            return self._run(path, lambda: self._get_pinned(store, key, options, identity, path))
        except FileNotFoundError:
            raise ObjectChanged(changed_message(self.unstrip_protocol(path), "deleted")) from None
        except ObjectChanged:  # some stores answer a condition on a deleted object with 412
            if self.exists(path):
                raise
            raise ObjectChanged(changed_message(self.unstrip_protocol(path), "deleted")) from None

    def _get_pinned(self, store: object, key: str, options: dict[str, object], identity: Identity, path: str) -> Any:
        """The range, after checking that the answer came from the pinned version: a server that
        ignores ``If-Match`` (many S3-compatible ones, some proxies) still names the version it
        served, and a different one is the same "store changed" as a 412."""
        result = library().get(store, key, options=options)
        meta = result.meta
        etag = (meta.get("e_tag") or "").strip('"')
        served = meta.get("version")
        if (identity.etag and etag and etag != identity.etag) or (identity.version and served
                                                                  and served != identity.version):
            raise ObjectChanged(changed_message(self.unstrip_protocol(path)))
        return result.bytes()

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        store, key = self.split(path)
        if start is None and end is None:
            return bytes(self._run(path, lambda: library().get(store, key).bytes()))
        start = start or 0
        if end is None or start < 0 or end < 0:
            size = self.info(path)["size"]
            start = start + size if start < 0 else start
            end = size if end is None else end + size if end < 0 else end
        return bytes(self._run(path, library().get_range, store, key, start=start, end=max(start, end)))

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        store, key = self.split(path)
        if key:
            try:
                return self._entry(path.split("/", 1)[0], self._run(path, library().head, store, key))
            except FileNotFoundError:
                pass  # no object: maybe a prefix (a folder)
        listed = self._run(path, library().list_with_delimiter, store, key or None)
        if key and not (listed["objects"] or listed["common_prefixes"]):
            raise FileNotFoundError(self.unstrip_protocol(path))
        return {"name": path, "size": 0, "type": "directory"}

    def exists(self, path: str, **kwargs: Any) -> bool:
        """Whether anything is at ``path``; a storage that fails says so (fsspec's default would
        call that "not there")."""
        try:
            self.info(path)
            return True
        except FileNotFoundError:
            return False

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[dict[str, Any]] | list[str]:
        path = self._strip_protocol(path)
        bucket = path.split("/", 1)[0]
        store, key = self.split(path)
        listed = self._run(path, library().list_with_delimiter, store, key or None)
        entries = [self._entry(bucket, meta) for meta in listed["objects"]]
        entries += [{"name": f"{bucket}/{p}", "size": 0, "type": "directory"} for p in listed["common_prefixes"]]
        if not entries:
            entries = [self.info(path)]  # a file lists as itself; a missing path raises
            if entries[0]["type"] == "directory":
                entries = []
        entries.sort(key=lambda e: e["name"])
        return entries if detail else [e["name"] for e in entries]

    def find(self, path: str, maxdepth: int | None = None, withdirs: bool = False, detail: bool = False,
             **kwargs: Any) -> dict[str, dict[str, Any]] | list[str]:
        """Every object under ``path``: one flat listing (pages of up to 1,000 keys), no walk."""
        path = self._strip_protocol(path)
        bucket = path.split("/", 1)[0]
        store, key = self.split(path)
        out: dict[str, dict[str, Any]] = {}
        for chunk in self._run(path, lambda: list(library().list(store, f"{key}/" if key else None))):
            for meta in chunk:
                entry = self._entry(bucket, meta)
                depth = entry["name"][len(path):].strip("/").count("/") + 1
                if maxdepth is None or depth <= maxdepth:
                    out[entry["name"]] = entry
        if not out and key:
            try:
                info = self.info(path)
                if info["type"] == "file":
                    out[path] = info
            except FileNotFoundError:
                pass
        return out if detail else sorted(out)

    @staticmethod
    def _entry(bucket: str, meta: Any) -> dict[str, Any]:
        return {"name": f"{bucket}/{meta['path']}", "size": meta["size"], "type": "file",
                "e_tag": (meta.get("e_tag") or "").strip('"') or None, "last_modified": meta.get("last_modified"),
                "version": meta.get("version")}

    def identity(self, path: str) -> Identity:
        return Identity.of(self.info(path))

    # ------------------------------------------------------------------ writes

    def pipe_file(self, path: str, value: bytes, **kwargs: Any) -> None:
        store, key = self.split(path)
        self._run(path, library().put, store, key, bytes(value))

    def put_file(self, lpath: str, rpath: str, **kwargs: Any) -> None:
        """Upload a local file: in blocks of ``UPLOAD_CHUNK``, ``UPLOAD_CONCURRENCY`` in flight,
        committed as one object at the end (a failed upload leaves no object)."""
        store, key = self.split(rpath)
        self._run(rpath, library().put, store, key, Path(lpath), chunk_size=UPLOAD_CHUNK,
                  max_concurrency=UPLOAD_CONCURRENCY)

    def rm_file(self, path: str) -> None:
        store, key = self.split(path)
        self._run(path, library().delete, store, key)

    def _rm(self, path: str) -> None:
        self.rm_file(path)

    def rm(self, path: str | list[str], recursive: bool = False, maxdepth: int | None = None) -> None:
        paths = [path] if isinstance(path, str) else list(path)
        targets: list[str] = []
        for p in paths:
            p = self._strip_protocol(p)
            found = self.find(p) if recursive else []
            targets.extend(found or [p])
        missing: FileNotFoundError | None = None
        for p in dict.fromkeys(targets):  # every path is tried; a missing one is reported at the end
            try:
                self.rm_file(p)
            except FileNotFoundError as exc:
                missing = missing or exc
        if missing is not None and not recursive:
            raise missing

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        pass  # object stores have no folders: a key's prefix is enough

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        pass

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        raise NotImplementedError(f"{self.unstrip_protocol(path)}: trainfeed reads objects in ranges, not as "
                                  "open files (storage/fetch.py)")


def _first_line(exc: Exception) -> str:
    """obstore's message without its debug dump, secrets removed (a request URL may carry a SAS token)."""
    text = str(exc).strip().split("\n\nDebug source:")[0]
    return redact(" ".join(text.split())[:400])


#: The file systems fsspec had cached when this process forked, held for the child's lifetime.
_held_at_fork: list[NativeFileSystem] = []


def _hold_cached() -> None:
    """fsspec empties its instance cache in a forked child (its own fork hook): a cached file
    system whose last reference that was would be freed there, and freeing its client calls the
    runtime the child inherited without its threads (a DataLoader worker hung that way). Held
    here, the child never frees them; the parent lets go right after the fork."""
    _held_at_fork[:] = list(NativeFileSystem._cache.values())


os.register_at_fork(before=_hold_cached, after_in_parent=_held_at_fork.clear)
