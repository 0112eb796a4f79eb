"""A storage emulator run as a local process on loopback (Azurite, moto's S3 server): started
in a session of its own on a free port, so that the PID held is the server's and a server
that hangs can be stopped with its children; its data lives in a work folder it owns unless
given one."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Self, TypeVar


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class LocalServer:
    port: int
    process: subprocess.Popen[bytes]
    workdir: Path
    owns_workdir: bool

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM to the server's session, SIGKILL if it lingers; then its own work folder goes."""
        if self.process.poll() is None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.process.wait(timeout)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self.owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_Server = TypeVar("_Server", bound=LocalServer)


def launch(cls: type[_Server], command: Callable[[int, Path], list[str]], *, name: str, error: type[Exception],
           port: int | None, workdir: Path | None, timeout: float, ready: Callable[[_Server], bool] | None = None,
           env: dict[str, str] | None = None) -> _Server:
    """Start ``command(port, workdir)`` and wait until it listens (and ``ready(server)``);
    ``error`` says clearly why not: the port is taken, the process exited, or it never answered."""
    if port is not None and port_open(port):
        raise error(f"port {port} on 127.0.0.1 is already in use; choose another (or omit it for a free one)")
    port = port or free_port()
    owns = workdir is None
    workdir = Path(workdir or tempfile.mkdtemp(prefix=f"trainfeed-{name.split()[0].lower()}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    log_file = workdir / "server.log"
    with open(log_file, "wb") as log:
        proc = subprocess.Popen(command(port, workdir), stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})}, cwd=workdir, start_new_session=True)
    server = cls(port, proc, workdir, owns)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise error(f"{name} exited with code {proc.returncode}; see {log_file}")
        if port_open(port) and (ready is None or ready(server)):
            return server
        time.sleep(0.1)
    server.stop()
    raise error(f"{name} did not answer on port {port} within {timeout:.0f} s")
