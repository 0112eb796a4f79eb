"""The registry of clouds: one object per kind of object storage, found by URL scheme.

A ``Cloud`` says everything trainfeed knows of one storage: its URL schemes, the noun for its
top level ("container", "bucket"), its storage options (a TypedDict, for type checkers), how a
location on it is opened (``open``), which options and environment variables hold secrets
(registered for redaction), what a URL's query may carry (an Azure SAS token), and the
emulators the tests run it against. ``ObjectStoreCloud`` is one reached through the native
client (obstore): it adds how fsspec's option names map to object_store's and which store
class is built. Every module asks ``cloud_for(scheme)``; none compares schemes itself.

Azure Blob, S3 and GCS are built in (``azure.py``, ``s3.py``, ``gcs.py``, registered when the
``storage`` package is imported); ``register_cloud`` adds another (a test's toy cloud, a user's
own storage behind an fsspec file system).
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeAlias, TypedDict, cast

from trainfeed.converters.redact import register_secret, register_secret_environment

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem
    from obstore._store import ClientConfig, RetryConfig

    from trainfeed.converters.storage.location import Location

#: Storage options as the public API takes them: any mapping of option names to values (a
#: cloud's TypedDict, ``AzureOptions``, ``S3Options``, ``GCSOptions``, or a plain dict).
StorageOptions: TypeAlias = Mapping[str, Any]

#: Options the native client takes as connection settings rather than store configuration.
CLIENT_KEYS = ("allow_http", "allow_invalid_certificates", "timeout", "connect_timeout", "proxy_url")


class CommonOptions(TypedDict, total=False):
    """Storage options every cloud takes: trainfeed's ``call_timeout`` (seconds one call may take,
    retries included; 0: no limit), and the native client's connection settings."""

    call_timeout: float | str
    endpoint: str
    allow_http: bool | str
    allow_invalid_certificates: bool | str
    timeout: str
    connect_timeout: str
    proxy_url: str


@dataclass(frozen=True, eq=False)
class Cloud:
    """One kind of storage reached by URL. Subclasses implement ``open``."""

    name: str  # what it is called in messages and results ("azure", "s3", ...)
    schemes: tuple[str, ...]  # lower case, without "://"
    options_type: type  # its storage options' TypedDict
    noun: str = "bucket"  # the top level of a URL's path ("container" on Azure)
    #: Option names whose values are secrets, beyond what ``redact.is_secret_name`` recognises.
    secret_options: frozenset[str] = frozenset()
    #: Environment variables holding its credentials: masked wherever their values appear.
    secret_environment: tuple[str, ...] = ()
    #: Modules under ``trainfeed.benchmarks.emulators`` that serve it on loopback for the tests.
    emulators: tuple[str, ...] = ()
    #: What ``url_options`` takes from a URL, as messages name it.
    url_options_are: str = "credentials"

    def open(self, url: str, options: dict[str, Any], deadline: float | None) -> AbstractFileSystem:
        """The file system ``url`` is reached through (``options`` without ``call_timeout``;
        ``deadline``: seconds one call may take)."""
        raise NotImplementedError(f"{self.name}: a cloud says how its locations are opened")

    def url_options(self, query: str) -> dict[str, str] | None:
        """Storage options a URL's query string carries (Azure: a SAS token), None if it is no
        such query (a URL with a query is then refused)."""
        return None

    def register_secrets(self, options: StorageOptions) -> None:
        """Register the values of ``secret_options`` for redaction."""
        for name in self.secret_options & options.keys():
            register_secret(options[name])

    def remove_uncommitted(self, location: Location, ours: Callable[[str], bool]) -> None:
        """Delete what a killed upload left at ``location`` that no listing shows (Azure's
        uncommitted blocks), for the blob names ``ours`` accepts. Most storages leave nothing."""


@dataclass(frozen=True, eq=False)
class ObjectStoreCloud(Cloud):
    """A cloud reached through the native client (obstore; delta-rs takes the same options)."""

    store_class: str = ""  # the obstore store class (``AzureStore``, ...), as ``client.library()`` names it
    #: fsspec's option names (adlfs's, s3fs's, gcsfs's) -> object_store's.
    option_names: Mapping[str, str] = field(default_factory=dict)
    #: The prefix of object_store's own option names for this cloud (``azure_``, ``aws_``, ``google_``).
    native_prefix: str = ""

    def open(self, url: str, options: dict[str, Any], deadline: float | None) -> AbstractFileSystem:
        from trainfeed.converters.storage.native import NativeFileSystem

        return NativeFileSystem(urlscheme(url), options, deadline, account=self.account_in_url(url))

    def account_in_url(self, url: str) -> str | None:
        """The account a URL names in its host (Azure's ``container@account.host``), if any."""
        return None

    def native_options(self, options: StorageOptions) -> dict[str, str]:
        """``options`` in object_store's names. Names already object_store's (any cloud's prefix,
        ``endpoint``, the client keys) pass through unchanged."""
        out: dict[str, str] = {}
        for key, value in options.items():
            if value is None:
                continue
            if is_object_store_name(key):
                out[key] = str(value)
            elif key in self.option_names:
                out[self.option_names[key]] = str(value)
            else:
                out.update(self.translate(key, value))
        if not out.keys() - set(CLIENT_KEYS):
            out.update(self.environment_options())
        endpoint = out.get("endpoint") or out.get("aws_endpoint_url") or os.environ.get("AWS_ENDPOINT_URL", "")
        if endpoint.startswith("http://"):
            out["allow_http"] = "true"
        return out

    def translate(self, key: str, value: Any) -> dict[str, str]:
        """An option that is not a plain rename (a connection string, nested client kwargs), in
        object_store's names; {} for one this cloud does not take."""
        return {}

    def environment_options(self) -> dict[str, str]:
        """Credentials the native client does not read from the environment itself, when no
        option names any (adlfs read ``AZURE_STORAGE_CONNECTION_STRING``; object_store does not)."""
        return {}

    def client_settings(self, options: StorageOptions,
                        deadline: float | None) -> tuple[dict[str, str], ClientConfig, RetryConfig]:
        """(store config, client options, retry config) for an obstore store. Every request is
        retried with exponential backoff (500, 503, connection resets, timeouts) until
        ``deadline`` seconds have passed since the call began; one request may take as long."""
        config = self.native_options(options)
        client: dict[str, Any] = {k: config.pop(k) for k in CLIENT_KEYS if k in config}
        if client.get("allow_http"):
            client["allow_http"] = client["allow_http"].lower() in ("1", "true", "yes")
        limit = timedelta(seconds=deadline) if deadline else timedelta(days=1)
        client.setdefault("timeout", limit)
        client.setdefault("connect_timeout", min(limit, timedelta(seconds=10)))
        retry: RetryConfig = {"max_retries": 1000, "retry_timeout": limit,  # the time limit binds, not a count
                              "backoff": {"init_backoff": timedelta(milliseconds=100),
                                          "max_backoff": timedelta(seconds=5), "base": 2.0}}
        return config, cast("ClientConfig", client), retry

    def new_store(self, library: Any, bucket: str, settings: tuple[dict[str, str], ClientConfig, RetryConfig]
                  ) -> object:
        """The obstore store of ``bucket``, built by ``library`` (``client.library()``: the copy of
        obstore this process may call) with ``client_settings``."""
        config, client, retry = settings
        store: object = getattr(library, self.store_class)(bucket, config=config, client_options=client,
                                                          retry_config=retry)
        return store


def urlscheme(url: str) -> str:
    """The scheme of a URL, lower case ("" for a path)."""
    return url.split("://", 1)[0].lower() if "://" in url else ""


def is_object_store_name(key: str) -> bool:
    """Whether ``key`` is already an object_store option name (some native cloud's prefix, or a
    name every store takes)."""
    prefixes = tuple(c.native_prefix for c in clouds() if isinstance(c, ObjectStoreCloud) and c.native_prefix)
    return key.startswith(prefixes) or key in ("endpoint", *CLIENT_KEYS)


_lock = threading.Lock()
_by_scheme: dict[str, Cloud] = {}


def register_cloud(cloud: Cloud) -> Cloud:
    """Add ``cloud`` under each of its schemes (a scheme taken by another cloud: ValueError);
    its credentials in the environment are registered for redaction now. Returns ``cloud``."""
    with _lock:
        taken = [s for s in cloud.schemes if _by_scheme.get(s, cloud) is not cloud]
        if taken:
            raise ValueError(f"cloud {cloud.name!r}: scheme(s) {', '.join(taken)} already belong to "
                             f"{_by_scheme[taken[0]].name!r}")
        _by_scheme.update(dict.fromkeys(cloud.schemes, cloud))
    register_secret_environment(cloud.secret_environment)
    return cloud


def unregister_cloud(cloud: Cloud) -> None:
    """Remove ``cloud`` (what ``register_cloud`` added)."""
    with _lock:
        for scheme in [s for s, c in _by_scheme.items() if c is cloud]:
            del _by_scheme[scheme]


def cloud_for(scheme: str) -> Cloud | None:
    """The cloud a URL scheme (``abfs``, ``s3``, ...) names, None for any other (a local path,
    ``file``, ``memory``, ``http``: plain fsspec)."""
    return _by_scheme.get(scheme.lower())


def clouds() -> tuple[Cloud, ...]:
    """Every registered cloud, once each."""
    with _lock:
        return tuple(dict.fromkeys(_by_scheme.values()))
