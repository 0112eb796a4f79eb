"""s3rver (npm), a file-backed S3 API server on loopback: the S3 server to time range readers
against. moto copies the whole object for every range GET, so it serves correctness tests
only; s3rver reads the requested bytes from its file.

Installed by ``make install`` (``npm install`` from package.json). It accepts the fixed
S3RVER key pair below (its documented defaults; not a secret) and answers a HEAD on a prefix
with a 500 where S3 answers 404: trainfeed's reads never HEAD a prefix, but a listing does.
"""
from __future__ import annotations

import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

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


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main() -> None:
    """``python -m trainfeed.benchmarks.emulators.s3rver``: run s3rver in the foreground with a bucket,
    for trying trainfeed against S3 without an account; prints the storage options to use."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m trainfeed.benchmarks.emulators.s3rver", description=main.__doc__)
    parser.add_argument("--bucket", required=True, help="bucket to create")
    parser.add_argument("--port", type=int, default=4568, help="port on 127.0.0.1 (default 4568)")
    parser.add_argument("--dir", help="folder for s3rver's data (default: a temporary folder, removed on exit)")
    args = parser.parse_args()
    try:
        server = start(args.bucket, args.port, Path(args.dir) if args.dir else None)
    except S3rverError as exc:
        raise SystemExit(f"error: {exc}") from None
    # s3rver's node process runs in a session of its own: without these, SIGTERM or SIGHUP would
    # end us and leave it running (the `with` below stops it on the way out)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGHUP, _exit_on_signal)
    with server:
        options = "".join(f"  --storage-option {k}={v}\n" for k, v in server.storage_options.items())
        print(f"s3rver is listening on {server.endpoint} with bucket {args.bucket!r}. Use it with:\n{options}"
              "Ctrl-C (or SIGTERM) stops it.", flush=True)
        try:
            code = server.process.wait()
        except KeyboardInterrupt:
            return
        raise SystemExit(f"error: s3rver exited by itself with code {code}")


if __name__ == "__main__":
    main()
