"""moto's S3 server, as a real S3 HTTP endpoint on loopback (the way s3fs's own tests run it).

Installed with the ``dev`` extra (``moto[server]``); run as ``python -m moto.server`` in a
process of its own (see localserver.py: in-process, it deadlocks against delta-rs, whose
HTTP calls hold the GIL). Any key and secret are accepted; the ones here are fixed so that
tests can look for them in what trainfeed prints and writes.
"""
from __future__ import annotations

import importlib.util
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainfeed.benchmarks.emulators.localserver import LocalServer, launch

ACCESS_KEY = "trainfeed-test-key"
# moto accepts any secret; this one is planted so tests can search outputs for it.
SECRET_KEY = "trainfeedMotoSecret0123456789abcdefSECRET"
REGION = "us-east-1"


class S3ServerError(RuntimeError):
    pass


@dataclass
class S3Server(LocalServer):
    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def storage_options(self) -> dict[str, Any]:
        """fsspec/s3fs options for s3:// URLs against this server."""
        return {"key": ACCESS_KEY, "secret": SECRET_KEY, "endpoint_url": self.endpoint,
                "client_kwargs": {"region_name": REGION}}

    @property
    def cli_options(self) -> list[str]:
        """The same options as ``--storage-option K=V`` arguments (the region comes from the
        endpoint's default; s3fs needs none for moto)."""
        return [arg for k in ("key", "secret", "endpoint_url")
                for arg in ("--storage-option", f"{k}={self.storage_options[k]}")]

    def filesystem(self) -> Any:
        """A fresh s3fs filesystem on this server (no instance cache, no listing cache)."""
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False, **self.storage_options)

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` (an existing one is kept); returns ``s3://name``."""
        import s3fs

        # No region here: s3fs would send it as a LocationConstraint, which S3 (and moto)
        # refuses for us-east-1.
        fs = s3fs.S3FileSystem(skip_instance_cache=True, key=ACCESS_KEY, secret=SECRET_KEY, endpoint_url=self.endpoint)
        if not fs.exists(name):
            fs.mkdir(name)
        return f"s3://{name}"

    def reset(self) -> None:
        """Drop every bucket and object (moto's own reset endpoint)."""
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        with urllib.request.urlopen(req, timeout=10):
            pass


def _answers(server: S3Server) -> bool:
    try:
        with urllib.request.urlopen(f"{server.endpoint}/moto-api/", timeout=1):
            return True
    except OSError:
        return False


def start(port: int | None = None, workdir: Path | None = None, timeout: float = 30.0) -> S3Server:
    """Start moto's S3 server on 127.0.0.1; fails clearly if the port is taken or moto is missing."""
    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("flask") is None:
        raise S3ServerError("moto's server is not installed: pip install 'moto[server]' (the dev extra)")
    return launch(S3Server, lambda p, w: [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(p)],
                  name="moto's server", error=S3ServerError, port=port, workdir=workdir, timeout=timeout,
                  ready=_answers, env={"AWS_DEFAULT_REGION": REGION})
