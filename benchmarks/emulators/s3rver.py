"""s3rver (npm), a file-backed S3 API server on loopback: the S3 server to time range readers
against. moto copies the whole object for every range GET, so it serves correctness tests
only; s3rver reads the requested bytes from its file.

Installed by ``make install`` (``npm install`` from package.json). It accepts the fixed
S3RVER key pair below (its documented defaults; not a secret) and answers a HEAD on a prefix
with a 500 where S3 answers 404: trainfeed's reads never HEAD a prefix, but a listing does.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from trainfeed.benchmarks.emulators.azurite import REPO_ROOT
from trainfeed.benchmarks.emulators.localserver import LocalServer, launch

ACCESS_KEY = "S3RVER"
SECRET_KEY = "S3RVER"


class S3rverError(RuntimeError):
    pass


@dataclass
class S3rver(LocalServer):
    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def storage_options(self) -> dict[str, str]:
        return {"key": ACCESS_KEY, "secret": SECRET_KEY, "endpoint_url": self.endpoint, "region_name": "us-east-1"}


def find_binary() -> Path:
    local = REPO_ROOT / "node_modules" / ".bin" / "s3rver"
    found = local if local.exists() else shutil.which("s3rver")
    if not found:
        raise S3rverError("s3rver is not installed: run `make install` (it runs `npm install` in the repository)")
    return Path(found)


def start(bucket: str, port: int | None = None, workdir: Path | None = None, timeout: float = 30.0) -> S3rver:
    """Start s3rver on 127.0.0.1 with ``bucket`` created."""
    binary = find_binary()
    return launch(S3rver, lambda p, w: [str(binary), "-d", str(w / "data"), "-a", "127.0.0.1", "-p", str(p),
                                        "--silent", "--no-vhost-buckets", "--configure-bucket", bucket],
                  name="s3rver", error=S3rverError, port=port, workdir=workdir, timeout=timeout)
