"""moto's S3 server, as a real S3 HTTP endpoint on loopback (the way s3fs's own tests run it).

Installed with the ``dev`` extra (``moto[server]``). The server runs as a subprocess of its
own (``python -m moto.server``) in a new session, so that the PID held is the server's and a
server that hangs can be killed with its children. Any key and secret are accepted; the ones
here are fixed so that tests can look for them in what trainfeed prints and writes.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .azurite import free_port, port_open

ACCESS_KEY = "trainfeed-test-key"
# moto accepts any secret; this one is planted so tests can search outputs for it.
SECRET_KEY = "trainfeedMotoSecret0123456789abcdefSECRET"
REGION = "us-east-1"


class S3ServerError(RuntimeError):
    pass


@dataclass
class S3Server:
    port: int
    process: subprocess.Popen
    workdir: Path
    owns_workdir: bool

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def storage_options(self) -> dict:
        """fsspec/s3fs options for s3:// URLs against this server."""
        return {"key": ACCESS_KEY, "secret": SECRET_KEY, "endpoint_url": self.endpoint,
                "client_kwargs": {"region_name": REGION}}

    @property
    def cli_options(self) -> list[str]:
        """The same options as ``--storage-option K=V`` arguments (the region comes from the
        endpoint's default; s3fs needs none for moto)."""
        return [arg for k in ("key", "secret", "endpoint_url")
                for arg in ("--storage-option", f"{k}={self.storage_options[k]}")]

    def filesystem(self):
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

    def stop(self, timeout: float = 5.0) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.process.wait(timeout)
        if self.owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> S3Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _answers(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1):
            return True
    except OSError:
        return False


def start(port: int | None = None, workdir: Path | None = None, timeout: float = 30.0) -> S3Server:
    """Start moto's S3 server on 127.0.0.1; fails clearly if the port is taken or moto is missing."""
    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("flask") is None:
        raise S3ServerError("moto's server is not installed: pip install 'moto[server]' (the dev extra)")
    if port is not None and port_open(port):
        raise S3ServerError(f"port {port} on 127.0.0.1 is already in use; choose another (or omit it for a free one)")
    port = port or free_port()
    owns = workdir is None
    workdir = Path(workdir or tempfile.mkdtemp(prefix="trainfeed-moto-"))
    workdir.mkdir(parents=True, exist_ok=True)
    log = open(workdir / "moto.log", "wb")
    env = {**os.environ, "AWS_DEFAULT_REGION": REGION}
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir, start_new_session=True)
    log.close()
    server = S3Server(port, proc, workdir, owns)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise S3ServerError(f"moto's server exited with code {proc.returncode}; see {workdir / 'moto.log'}")
        if port_open(port) and _answers(server.endpoint):
            return server
        time.sleep(0.1)
    server.stop()
    raise S3ServerError(f"moto's server did not answer on port {port} within {timeout:.0f} s")
