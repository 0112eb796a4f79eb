"""Storage options, translated in one place.

Users write fsspec's option names (adlfs's and s3fs's: ``connection_string``, ``account_name``,
``key``, ``endpoint_url``, ...) or object_store's own (``azure_*``, ``aws_*``, ``google_*``);
environment variables are read by the client itself. ``parse_storage_options`` reads the
``KEY=VALUE`` pairs every command and job takes. ``object_store_options`` gives
object_store's names, which both trainfeed's native client (obstore) and delta-rs take (each
cloud's mapping: ``clouds.py``). ``parse_url`` checks every path or URL a user gives.
"""
from __future__ import annotations

import math
import re
from typing import Any

from fsspec.exceptions import FSTimeoutError

from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.redact import redact, redact_url, register_secret, register_storage_options
from trainfeed.converters.storage.clouds import CommonOptions, ObjectStoreCloud, StorageOptions, cloud_for

#: Storage option read by trainfeed, not handed to a client: the seconds one call to a remote
#: store (the folder check, one file's read, one range, the labels file) may take, retries included.
CALL_TIMEOUT = "call_timeout"
DEFAULT_CALL_TIMEOUT_S = 30.0

def parse_storage_options(pairs: list[str]) -> dict[str, str | bool]:
    """`--storage-option KEY=VALUE` pairs as fsspec / delta-rs options; secret values are
    registered for redaction before anything can print them."""
    out: dict[str, str | bool] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            # the text is not echoed: a mistyped pair (key:secret) may hold a credential
            raise UsageError("--storage-option expects KEY=VALUE; one has no '=' or no key")
        # fsspec backends take real booleans (anon=false must not be the truthy string "false")
        out[key.strip()] = {"true": True, "false": False}.get(value.strip().lower(), value)
    register_storage_options(out)
    return out


def call_timeout(storage_options: StorageOptions | None) -> float | None:
    """The ``call_timeout`` storage option in seconds (default 30; 0: no limit)."""
    value = (storage_options or {}).get(CALL_TIMEOUT, DEFAULT_CALL_TIMEOUT_S)
    try:
        seconds = float(value) if not isinstance(value, bool) else -1.0
    except ValueError:
        seconds = -1.0
    if seconds < 0 or math.isnan(seconds):
        raise UsageError(f"--storage-option {CALL_TIMEOUT} expects a number of seconds (0: no limit), got {value!r}")
    return seconds or None


class NoAnswer(TrainfeedError, FSTimeoutError):  # type: ignore[misc]  # fsspec is untyped
    """The storage did not answer within ``call_timeout`` (retries included): an FSTimeoutError
    for the callers that handle one, with the message a user needs for those that do not."""


def no_answer(url: str, deadline: float | None) -> str:
    limit = f"within {deadline:g} s" if deadline else "in time"
    return (f"{url}: the storage did not answer {limit} (retries included); check that it is "
            f"reachable, or allow longer with --storage-option {CALL_TIMEOUT}=SECONDS")


class BucketNotFound(TrainfeedError, FileNotFoundError):
    """The bucket (container) a URL names does not exist at the endpoint."""


def bucket_not_found(url: str) -> str:
    """The message for a URL whose bucket (container) does not exist."""
    scheme, rest = url.split("://", 1)
    cloud = cloud_for(scheme)
    what = cloud.noun if cloud else "bucket"
    return (f"{url}: {what} {rest.split('/', 1)[0]!r} not found; check its name and the account or endpoint "
            f"(trainfeed does not create {what}s)")


#: object_store's names for a scheme no native cloud serves: only names already object_store's pass.
_ANY_STORE = ObjectStoreCloud(name="object_store", schemes=(), options_type=CommonOptions)


def object_store_options(scheme: str, options: StorageOptions) -> dict[str, str]:
    """fsspec storage options (adlfs, s3fs names) in object_store's names (the scheme's cloud's
    mapping). Options already in those names (``azure_storage_*``, ``aws_*``, ``google_*``)
    pass through unchanged; trainfeed's own (``call_timeout``) are dropped."""
    cloud = cloud_for(scheme)
    return (cloud if isinstance(cloud, ObjectStoreCloud) else _ANY_STORE).native_options(options)


#: Schemes whose URLs must have ``//``: the clouds', and these that fsspec knows besides.
_FSSPEC_SCHEMES = {"file", "memory", "http", "https", "hdfs", "adl", "emulated"}
_SCHEME_NO_SLASHES = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]+):(?!//)(.*)", re.S)
#: What a bucket or container (and an ``@account.host`` or ``:port`` after it) may hold.
_HOST = re.compile(r"(?:[^@/\s?#]+@)?[A-Za-z0-9._\-]+(?::\d+)?")


def scheme_without_slashes(text: str) -> None:
    m = _SCHEME_NO_SLASHES.fullmatch(text)
    if m and (m.group(1).lower() in _FSSPEC_SCHEMES or cloud_for(m.group(1)) is not None):
        scheme, rest = m.group(1), m.group(2).lstrip("/")
        fixed = f"{scheme}://{'/' if scheme.lower() == 'file' else ''}{rest}"
        raise UsageError(f"{redact_url(text)}: not a valid URL: '{scheme}:' must be followed by '//' (did you mean "
                         f"{redact_url(fixed)}?); for a local folder with this name, write ./{redact_url(text)}")


def parse_url(url: object, storage_options: StorageOptions | None = None) -> tuple[str, dict[str, Any]]:
    """Check a path or URL a user gave (see storage/location.py's docstring) and return it with its
    storage options: for a URL carrying an Azure SAS token, the URL without it and the token
    in the options as ``sas_token``. UsageError, naming the fix, for what cannot mean one
    place. A local path is returned as it is."""
    text = str(url)
    options = dict(storage_options or {})
    if "://" not in text:
        scheme_without_slashes(text)
        return text, options
    scheme, rest = text.split("://", 1)
    cloud = cloud_for(scheme)
    if cloud is None:
        return text, options  # http (a query is part of it), memory://, a user's own file system
    cloud.register_secrets(options)
    shown = redact_url(text)
    host = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    if not rest:
        return text, options  # the account (``filesystem("abfs")``), no bucket named
    if not host:
        raise UsageError(f"{shown}: no bucket or container after '{scheme}://' (write {scheme}://BUCKET/PATH)")
    if not _HOST.fullmatch(host):
        bad = sorted({c for c in host if not re.match(r"[A-Za-z0-9._\-@:]", c)}) or ["@ or :"]
        shown_bad = ", ".join(repr(c) for c in bad)
        raise UsageError(f"{redact(scheme + '://' + host)!r}: a bucket or container name cannot hold {shown_bad} "
                         "(only letters, digits, '.', '-' and '_'); check the URL for a stray space or character")
    if any(ord(c) < 32 or c == "\x7f" for c in rest):
        raise UsageError(f"{shown!r}: a control character (newline, tab, ...) in an object storage URL; remove it")
    if "#" in rest:
        raise UsageError(f"{shown}: '#' in an object storage URL: it would be a fragment to one client and part of "
                         "the name to another; choose a name without '#'")
    if "?" in rest:
        base, query = rest.split("?", 1)
        carried = cloud.url_options(query)
        if carried is None:
            raise UsageError(f"{shown}?...: an object storage URL cannot hold a query string: '?' would start one "
                             "for one client and be part of the name for another; choose a name without '?', "
                             "and pass credentials with --storage-option (e.g. sas_token=...)")
        for name, value in carried.items():
            register_secret(value)
            if options.get(name) not in (None, value):
                raise UsageError(f"{shown}: the URL carries {cloud.url_options_are} and --storage-option {name} "
                                 "gives another; pass one")
            options[name] = value
        text = f"{scheme}://{base}"
    return text, options
