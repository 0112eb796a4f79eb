"""A loopback relay in front of a real storage endpoint (Azurite, s3rver, moto) that holds one
request: the first whose request line matches a pattern is kept, unsent, until ``release()``,
then forwarded as if nothing happened. A test thereby knows that a client is waiting on that
request (an upload still pending, the commit in flight) and acts at that moment, without a
timing guess. A request still held when the relay closes (its client killed meanwhile) is
never forwarded. Clients here do not pipeline, so each request starts a read."""
from __future__ import annotations

import contextlib
import re
import socket
import threading


class HoldGate:
    _REQUEST_LINE = re.compile(rb"(?:GET|PUT|POST|HEAD|DELETE|PATCH|OPTIONS) \S+ HTTP/1\.[01]\r\n")

    def __init__(self, upstream_port: int, pattern: bytes, *, release_after: float = 60.0):
        self.upstream = ("127.0.0.1", upstream_port)
        self.pattern = re.compile(pattern)
        self.held = threading.Event()
        self.released = threading.Event()
        self.release_after = release_after  # never holds longer: a test that fails cannot hang
        self.held_line = b""
        self.requests: list[bytes] = []  # every request line forwarded, in order
        self._taken = False
        self._closing = False
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def release(self) -> None:
        self.released.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(self.upstream)
            except OSError:
                return
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._requests, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._responses, args=(upstream, client), daemon=True).start()

    def _hold(self, line: bytes) -> bool:
        with self._lock:
            if self._taken or not self.pattern.search(line):
                return False
            self._taken = True
        self.held_line = line.strip()
        self.held.set()
        self.released.wait(self.release_after)
        return True

    def _requests(self, client: socket.socket, upstream: socket.socket) -> None:
        pending = b""
        try:
            while data := client.recv(1 << 16):
                data, pending = pending + data, b""
                if re.match(rb"[A-Z]+ ", data[:16]) and b"\r\n" not in data and len(data) < 8192:
                    pending = data  # a request line cut short: read the rest of it first
                    continue
                for line in self._REQUEST_LINE.finditer(data):
                    self.requests.append(line.group(0).strip())
                    if self._hold(line.group(0)) and self._closing:
                        return  # closed while held (its client killed): never forwarded
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            for s in (client, upstream):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    @staticmethod
    def _responses(upstream: socket.socket, client: socket.socket) -> None:
        try:
            while data := upstream.recv(1 << 16):
                client.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closing = True
        self.release()
        self._listener.close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.close()
