"""Azurite, Microsoft's Azure Blob Storage emulator, as a real blob endpoint on loopback.

Installed by ``make install`` (``npm install`` from package.json). The node process is
started directly (not through npx) so the PID held is the server's; it may ignore SIGTERM
for a while, so stopping waits briefly and then kills it (see localserver.py).
"""
from __future__ import annotations

import contextlib
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from trainfeed.benchmarks.emulators.localserver import LocalServer, launch

ACCOUNT = "devstoreaccount1"
# The emulator's well-known development key (public, documented by Microsoft; not a secret).
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
REPO_ROOT = Path(__file__).resolve().parents[2]


class AzuriteError(RuntimeError):
    pass


def find_binary() -> Path:
    candidates = [REPO_ROOT / "node_modules" / ".bin" / "azurite-blob"]
    on_path = shutil.which("azurite-blob")
    if on_path:
        candidates.append(Path(on_path))
    for c in candidates:
        if c.exists():
            return c
    raise AzuriteError("Azurite is not installed: run `make install` (it runs `npm install` in the repository)")


@dataclass
class Azurite(LocalServer):
    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/{ACCOUNT}"

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
                f"BlobEndpoint={self.endpoint};")

    @property
    def storage_options(self) -> dict[str, str]:
        """Storage options (fsspec's names) for abfs:// URLs against this emulator."""
        return {"connection_string": self.connection_string}

    def create_container(self, name: str) -> None:
        """Create container ``name`` if it is not there (object-store clients read and write
        blobs; creating a container is the account's business, done here with Azure's SDK)."""
        from azure.core.exceptions import ResourceExistsError
        from azure.storage.blob import BlobServiceClient

        with contextlib.suppress(ResourceExistsError):
            BlobServiceClient.from_connection_string(self.connection_string).create_container(name)


def start(port: int | None = None, workdir: Path | None = None, timeout: float = 30.0) -> Azurite:
    """Start Azurite's blob service on 127.0.0.1; fails clearly if the port is taken."""
    binary = find_binary()
    return launch(Azurite, lambda p, w: [str(binary), "--blobHost", "127.0.0.1", "--blobPort", str(p), "--location",
                                         str(w), "--silent", "--skipApiVersionCheck", "--loose", "--disableTelemetry"],
                  name="Azurite", error=AzuriteError, port=port, workdir=workdir, timeout=timeout)


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main() -> None:
    """``python -m trainfeed.benchmarks.emulators.azurite``: run Azurite in the foreground for trying
    trainfeed against Azure Blob without an Azure account; prints the storage option to use."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m trainfeed.benchmarks.emulators.azurite", description=main.__doc__)
    parser.add_argument("--port", type=int, default=10000, help="blob service port on 127.0.0.1 (default 10000)")
    parser.add_argument("--location", help="folder for Azurite's data (default: a temporary folder, removed on exit)")
    parser.add_argument("--container", default="trainfeed", help="container to create (default trainfeed)")
    args = parser.parse_args()
    try:
        server = start(args.port, Path(args.location) if args.location else None)
    except AzuriteError as exc:
        raise SystemExit(f"error: {exc}") from None
    # SIGTERM (kill, a service manager, the end of a job) stops Azurite too: its node process runs in a
    # session of its own, so without this it would outlive us (the `with` below stops it on the way out)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGHUP, _exit_on_signal)
    with server:
        server.create_container(args.container)
        print(f"Azurite is listening on {server.endpoint} with container {args.container!r}. Use it with:\n"
              f"  --storage-option 'connection_string={server.connection_string}'\n"
              f"or export AZURE_STORAGE_CONNECTION_STRING='{server.connection_string}'\n"
              "Ctrl-C (or SIGTERM) stops it.", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            server.process.wait()


if __name__ == "__main__":
    main()
