"""One redaction function for everything trainfeed prints or writes.

Error messages, log lines, summaries, reports and rejects files all pass through
``redact()``: it removes URL query strings (SAS tokens) and user info, the values of
options whose names say they are secrets, the secret parts of connection strings, and any
secret value trainfeed was handed (``--storage-option account_key=...``, the usual
credential environment variables), wherever it appears.
"""
from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "***"

#: Option / field names whose values are secrets (case-insensitive): a name containing one of
#: these, or having one of the short words as a ``_``/``-`` separated part (``account_key``).
SECRET_NAME_PARTS = (
    "secret", "token", "password", "passwd", "credential", "signature", "accountkey", "connectionstring",
    "connection_string", "sastoken", "apikey",
)
SECRET_NAME_WORDS = ("key", "sig", "sas", "pwd")
#: Names that contain a secret-looking part but hold no secret (s3fs's `key` is the access key id).
_NOT_SECRET_NAMES = {"key", "key_id", "access_key_id", "aws_access_key_id", "account_name", "anon", "use_ssl"}

#: Environment variables whose values are credentials, besides each cloud's (its
#: ``secret_environment``, added by ``register_secret_environment`` when it is registered).
SECRET_ENV = ("DATABRICKS_TOKEN",)

_known: set[str] = set()
_secret_env: set[str] = set(SECRET_ENV)
_lock = threading.Lock()

# scheme://user:password@host -> scheme://host ; any ?query on a URL -> ?***
_USERINFO = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.\-]*://)[^/@\s'\"]+@")
_QUERY = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s'\"?]*)\?[^\s'\"]*")
# AccountKey=...; SharedAccessSignature=...; (connection strings), key=value and "key": "value"
_CONN_PART = re.compile(r"(?i)\b(AccountKey|SharedAccessSignature|SharedAccessKey|Password|Secret)=([^;\s'\"]+)")
_NAME_SEP = re.compile(r"""(["']?)([A-Za-z_][A-Za-z0-9_\-]*)\1(\s*[=:]\s*)(["']?)""")
_VALUE = re.compile(r"""[^\s'",;}&]+""")


def is_secret_name(name: str) -> bool:
    low = name.lower().replace("-", "_")
    if low in _NOT_SECRET_NAMES:
        return False
    return any(part in low for part in SECRET_NAME_PARTS) or any(w in low.split("_") for w in SECRET_NAME_WORDS)


def register_secret(value: Any) -> None:
    """Remember a secret value so that it is masked wherever it appears later."""
    if isinstance(value, str) and len(value) >= 4:
        with _lock:
            _known.add(value)
            # connection strings: each secret part on its own, too
            for m in _CONN_PART.finditer(value):
                if len(m.group(2)) >= 4:
                    _known.add(m.group(2))


def register_storage_options(options: Mapping[str, Any] | None) -> None:
    """Register the secret values of fsspec / delta-rs storage options."""
    for key, value in (options or {}).items():
        if is_secret_name(str(key)):
            register_secret(value)


def register_secret_environment(names: Iterable[str]) -> None:
    """Treat these environment variables as credentials: their values are masked from now on,
    and again whenever ``register_environment`` reads the environment."""
    names = tuple(names)
    with _lock:
        _secret_env.update(names)
    for name in names:
        register_secret(os.environ.get(name))


def register_environment() -> None:
    """Register the values of every credential variable in the environment now."""
    with _lock:
        names = sorted(_secret_env)
    for name in names:
        register_secret(os.environ.get(name))


def _mask_query(m: re.Match[str]) -> str:
    """``url?query`` -> ``url?***``, keeping punctuation that ends the sentence (``url?q: msg``)."""
    tail = len(m.group(0)) - len(m.group(0).rstrip(":,.;)"))
    return f"{m.group(1)}?{MASK}{m.group(0)[len(m.group(0)) - tail:] if tail else ''}"


def _mask_named_values(text: str) -> str:
    """``name=value`` / ``"name": "value"`` with a secret-looking name -> the value masked."""
    out, pos = [], 0
    for m in _NAME_SEP.finditer(text):
        if m.start() < pos or not is_secret_name(m.group(2)):
            continue
        value = _VALUE.match(text, m.end())
        if value is None or value.group(0) == MASK:
            continue
        out.append(text[pos:m.end()] + MASK)
        pos = value.end()
    return "".join(out) + text[pos:]


def redact(text: Any) -> str:
    """``text`` as a string with every secret it holds replaced by ``***``."""
    out = str(text)
    with _lock:
        known = sorted(_known, key=len, reverse=True)
    for secret in known:
        if secret in out:
            out = out.replace(secret, MASK)
    out = _USERINFO.sub(r"\1", out)
    out = _QUERY.sub(_mask_query, out)
    out = _CONN_PART.sub(lambda m: f"{m.group(1)}={MASK}", out)
    return _mask_named_values(out)


def redact_url(url: str) -> str:
    """A URL without its query string and user info (for storing a source's location)."""
    if "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    rest = rest.split("?", 1)[0]
    host, sep, path = rest.partition("/")
    return redact(f"{scheme}://{host.rsplit('@', 1)[-1]}{sep}{path}")


def redact_obj(obj: Any) -> Any:
    """A JSON-like structure with secret-named values masked and every string redacted."""
    if isinstance(obj, dict):
        return {k: (MASK if isinstance(k, str) and is_secret_name(k) and isinstance(v, str) else redact_obj(v))
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_obj(v) for v in obj]
    if isinstance(obj, str):
        return redact(obj)
    return obj


def redact_json(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of ``obj`` after redaction."""
    return json.dumps(redact_obj(obj), **kwargs)
