"""Storage options, translated in one place.

Users write fsspec's option names (adlfs's and s3fs's: ``connection_string``, ``account_name``,
``key``, ``endpoint_url``, ...) or object_store's own (``azure_*``, ``aws_*``, ``google_*``);
environment variables are read by the client itself. ``parse_storage_options`` reads the
``KEY=VALUE`` pairs every command and job takes. ``object_store_options`` gives
object_store's names, which both trainfeed's native client (obstore) and delta-rs take;
``client_settings`` splits them into what obstore's store constructors want.
"""
from __future__ import annotations

import math
import os
import re
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fsspec.exceptions import FSTimeoutError

from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.redact import redact, redact_url, register_secret, register_storage_options

AZURE = ("abfs", "abfss", "az")
S3 = ("s3", "s3a")
GCS = ("gs", "gcs")
#: URL schemes read and written through the native client; any other fsspec URL goes through fsspec.
NATIVE_SCHEMES = AZURE + S3 + GCS

#: Storage option read by trainfeed, not handed to a client: the seconds one call to a remote
#: store (the folder check, one file's read, one range, the labels file) may take, retries included.
CALL_TIMEOUT = "call_timeout"
DEFAULT_CALL_TIMEOUT_S = 30.0

#: Options the native client takes as connection settings rather than store configuration.
_CLIENT_KEYS = ("allow_http", "allow_invalid_certificates", "timeout", "connect_timeout", "proxy_url")


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


def call_timeout(storage_options: dict | None) -> float | None:
    """The ``call_timeout`` storage option in seconds (default 30; 0: no limit)."""
    value = (storage_options or {}).get(CALL_TIMEOUT, DEFAULT_CALL_TIMEOUT_S)
    try:
        seconds = float(value) if not isinstance(value, bool) else -1.0
    except ValueError:
        seconds = -1.0
    if seconds < 0 or math.isnan(seconds):
        raise UsageError(f"--storage-option {CALL_TIMEOUT} expects a number of seconds (0: no limit), got {value!r}")
    return seconds or None


class NoAnswer(TrainfeedError, FSTimeoutError):
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
    what = "container" if scheme in AZURE else "bucket"
    return (f"{url}: {what} {rest.split('/', 1)[0]!r} not found; check its name and the account or endpoint "
            f"(trainfeed does not create {what}s)")


_AZURE_NAMES = {"account_name": "account_name", "account_key": "account_key", "sas_token": "sas_token",
                "client_id": "client_id", "client_secret": "client_secret", "tenant_id": "tenant_id"}
_S3_NAMES = {"key": "aws_access_key_id", "secret": "aws_secret_access_key", "token": "aws_session_token",
             "endpoint_url": "aws_endpoint_url", "region_name": "aws_region"}


def _connection_string(text: str) -> dict[str, str]:
    """An Azure connection string's parts in object_store's names. A SAS connection string
    (``BlobEndpoint=...;SharedAccessSignature=...``) names no account: it is the endpoint's
    (``https://ACCOUNT.blob.core.windows.net``, or the emulator's ``http://host:port/ACCOUNT``)."""
    parts = {k.strip(): v.strip() for k, v in (p.split("=", 1) for p in text.split(";") if "=" in p)}
    out = {"account_name": parts.get("AccountName"), "account_key": parts.get("AccountKey"),
           "sas_token": (parts.get("SharedAccessSignature") or "").lstrip("?"), "endpoint": parts.get("BlobEndpoint")}
    if not out["account_name"] and out["endpoint"]:
        endpoint = urlsplit(out["endpoint"])
        first = endpoint.path.strip("/").split("/")[0]
        out["account_name"] = first or (endpoint.hostname or "").split(".")[0]
    return {k: v for k, v in out.items() if v}


def object_store_options(scheme: str, options: dict) -> dict[str, str]:
    """fsspec storage options (adlfs, s3fs names) in object_store's names. Options already in
    those names (``azure_storage_*``, ``aws_*``, ``google_*``) pass through unchanged;
    trainfeed's own (``call_timeout``) are dropped."""
    out: dict[str, str] = {}
    for key, value in options.items():
        if key == CALL_TIMEOUT or value is None:
            continue
        if key.startswith(("azure_", "aws_", "google_")) or key in ("allow_http", "endpoint") + _CLIENT_KEYS:
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
    if scheme in AZURE and not out.keys() - set(_CLIENT_KEYS) and os.environ.get("AZURE_STORAGE_CONNECTION_STRING"):
        # adlfs read this variable; object_store does not
        out.update(_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"]))
    endpoint = out.get("endpoint") or out.get("aws_endpoint_url") or os.environ.get("AWS_ENDPOINT_URL", "")
    if endpoint.startswith("http://"):
        out["allow_http"] = "true"
    if scheme in S3:
        # S3 has no atomic rename: delta-rs commits with conditional writes (If-None-Match),
        # which S3 has supported since 2024, so two writers can never both commit a version.
        out.setdefault("conditional_put", "etag")
    return out


def client_settings(scheme: str, options: dict, deadline: float | None) -> tuple[dict, dict[str, Any], dict]:
    """(store config, client options, retry config) for an obstore store. Every request is
    retried with exponential backoff (500, 503, connection resets, timeouts) until
    ``deadline`` seconds have passed since the call began; one request may take as long."""
    config = object_store_options(scheme, options)
    client: dict[str, Any] = {k: config.pop(k) for k in _CLIENT_KEYS if k in config}
    if client.get("allow_http"):
        client["allow_http"] = client["allow_http"].lower() in ("1", "true", "yes")
    if scheme not in S3:
        config.pop("conditional_put", None)
    limit = timedelta(seconds=deadline) if deadline else timedelta(days=1)
    client.setdefault("timeout", limit)
    client.setdefault("connect_timeout", min(limit, timedelta(seconds=10)))
    retry = {"max_retries": 1000, "retry_timeout": limit,  # the time limit binds, not a count
             "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=5),
                         "base": 2.0}}
    return config, client, retry


#: Schemes whose URLs must have ``//``: the object stores, and what fsspec knows besides.
_STORAGE_SCHEMES = set(NATIVE_SCHEMES) | {"file", "memory", "http", "https", "hdfs", "gcs", "adl", "emulated"}
_SCHEME_NO_SLASHES = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]+):(?!//)(.*)", re.S)
#: What a bucket or container (and an ``@account.host`` or ``:port`` after it) may hold.
_HOST = re.compile(r"(?:[^@/\s?#]+@)?[A-Za-z0-9._\-]+(?::\d+)?")


def scheme_without_slashes(text: str) -> None:
    m = _SCHEME_NO_SLASHES.fullmatch(text)
    if m and m.group(1).lower() in _STORAGE_SCHEMES:
        scheme, rest = m.group(1), m.group(2).lstrip("/")
        fixed = f"{scheme}://{'/' if scheme.lower() == 'file' else ''}{rest}"
        raise UsageError(f"{redact_url(text)}: not a valid URL: '{scheme}:' must be followed by '//' (did you mean "
                         f"{redact_url(fixed)}?); for a local folder with this name, write ./{redact_url(text)}")


def parse_url(url, storage_options: dict | None = None) -> tuple[str, dict]:
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
    if scheme.lower() not in NATIVE_SCHEMES:
        return text, options  # http (a query is part of it), memory://, a user's own file system
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
        sas = _sas_token(scheme, query)
        if sas is None:
            raise UsageError(f"{shown}?...: an object storage URL cannot hold a query string: '?' would start one "
                             "for one client and be part of the name for another; choose a name without '?', "
                             "and pass credentials with --storage-option (e.g. sas_token=...)")
        register_secret(sas)
        given = options.get("sas_token")
        if given not in (None, sas):
            raise UsageError(f"{shown}: the URL carries a SAS token and --storage-option sas_token gives another; "
                             "pass one")
        options["sas_token"] = sas
        text = f"{scheme}://{base}"
    return text, options


def _sas_token(scheme: str, query: str) -> str | None:
    """``query`` if it is an Azure SAS token (it has a signature ``sig``), else None."""
    if scheme.lower() not in AZURE:
        return None
    try:
        fields = parse_qs(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        return None
    return query if fields.get("sig") and fields.get("sv") else None
