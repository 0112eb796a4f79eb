"""A loopback HTTP relay in front of a real storage server (Azurite, moto) that injects faults.

Every request is forwarded to the server as it came (method, path, headers, body) and its
answer streamed back, except where a fault is armed:

- ``fail(n, status)``: the next ``n`` requests are answered ``status`` (503: the storage is
  throttling, 500: an internal error) without reaching the server;
- ``cut(n, after)``: the next ``n`` GETs with a ``Range`` header get their status line,
  headers and ``after`` bytes of the body, then the connection is reset (RST);
- ``deny()``: from now on every request is answered 403, as when credentials expired;
- ``stall()``: requests are held without an answer until ``release()``.

``requests`` records (method, path, range header, what the relay did) for each request.
"""
from __future__ import annotations

import http.client
import socket
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


class Relay:
    def __init__(self, upstream: str):
        target = urlsplit(upstream)
        self.upstream_host, self.upstream_port = target.hostname, target.port
        self.prefix = target.path.rstrip("/")
        self._lock = threading.Lock()
        self._fail: list[int] = []
        self._cut: list[int] = []
        self._denied = False
        self._released = threading.Event()
        self._released.set()
        self.requests: list[tuple[str, str, str | None, str]] = []
        relay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _any(self):
                relay._handle(self)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        # a client that gives up on a request (a retry, a timeout) closes its socket: not an error here
        self.server.handle_error = lambda request, client_address: None
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.prefix}"

    # ------------------------------------------------------------------ arming faults

    def fail(self, n: int, status: int = 503) -> None:
        with self._lock:
            self._fail.extend([status] * n)

    def cut(self, n: int, after: int) -> None:
        with self._lock:
            self._cut.extend([after] * n)

    def deny(self) -> None:
        self._denied = True

    def stall(self) -> None:
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def count(self, what: str) -> int:
        return sum(1 for r in self.requests if r[3] == what)

    # ------------------------------------------------------------------ forwarding

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        length = int(req.headers.get("Content-Length") or 0)
        body = req.rfile.read(length) if length else None
        rng = req.headers.get("Range") or req.headers.get("x-ms-range")
        self._released.wait(60)
        with self._lock:
            status = self._fail.pop(0) if self._fail else (403 if self._denied else None)
            cut = self._cut.pop(0) if status is None and self._cut and req.command == "GET" and rng else None
        what = "denied" if status == 403 else f"status {status}" if status else f"cut {cut}" if cut else "forwarded"
        self.requests.append((req.command, req.path, rng, what))
        if status is not None:
            text = b"<?xml version='1.0'?><Error><Code>Injected</Code><Message>injected by the relay</Message></Error>"
            req.send_response(status)
            req.send_header("Content-Type", "application/xml")
            req.send_header("Content-Length", str(len(text)))
            req.end_headers()
            req.wfile.write(text)
            return
        conn = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=60)
        headers = {k: v for k, v in req.headers.items() if k.lower() not in _HOP}
        conn.request(req.command, req.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        req.send_response(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in _HOP and k.lower() != "content-length":
                req.send_header(k, v)
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        if cut is not None:
            req.wfile.write(data[:cut])
            req.wfile.flush()
            # RST, not FIN: the client sees a connection reset in the middle of the body
            req.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            req.connection.close()
            req.close_connection = True
            return
        if req.command != "HEAD":
            req.wfile.write(data)

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
