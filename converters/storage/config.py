"""Storage options, translated in one place.

Users write fsspec's option names (adlfs's and s3fs's: ``connection_string``, ``account_name``,
``key``, ``endpoint_url``, ...) or object_store's own (``azure_*``, ``aws_*``, ``google_*``);
environment variables are read by the client itself. ``object_store_options`` gives
object_store's names, which both trainfeed's native client (obstore) and delta-rs take;
``client_settings`` splits them into what obstore's store constructors want.
"""
from __future__ import annotations

import math
import os
from datetime import timedelta

from trainfeed.converters.errors import UsageError

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


def no_answer(url: str, deadline: float | None) -> str:
    limit = f"within {deadline:g} s" if deadline else "in time"
    return (f"{url}: the storage did not answer {limit} (retries included); check that it is "
            f"reachable, or allow longer with --storage-option {CALL_TIMEOUT}=SECONDS")


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


def client_settings(scheme: str, options: dict, deadline: float | None) -> tuple[dict, dict, dict]:
    """(store config, client options, retry config) for an obstore store. Every request is
    retried with exponential backoff (500, 503, connection resets, timeouts) until
    ``deadline`` seconds have passed since the call began; one request may take as long."""
    config = object_store_options(scheme, options)
    client = {k: config.pop(k) for k in _CLIENT_KEYS if k in config}
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
