"""A loopback relay that adds a fixed latency to every request on its way to a storage server
(Azurite, s3rver): what a cloud region adds to each GET, for measuring whether a reader hides it.

Each chunk a client sends is forwarded ``delay`` seconds after it arrived (order kept, later
chunks not held up by earlier ones' waits beyond their own); answers come back at once. A
request is one chunk on loopback, so each request waits ``delay`` once, however many are in
flight: latency, not a bandwidth limit.

    with LatencyRelay(server.port, 0.020) as relay:
        endpoint = f"http://127.0.0.1:{relay.port}"

It counts the bytes the server answered (``answered``: what a reader really fetched), and can
play an outage: ``down(True)`` drops every connection and refuses new ones until ``down(False)``.
"""
from __future__ import annotations

import asyncio
import threading


class LatencyRelay:
    def __init__(self, upstream_port: int, delay: float, host: str = "127.0.0.1") -> None:
        self.upstream = (host, upstream_port)
        self.delay = delay
        self.port = 0
        self.answered = 0  # bytes from the server to its clients
        self._down = False
        self._open: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="latency-relay", daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._connection, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    def down(self, down: bool) -> None:
        """An outage (True): every connection dropped, new ones refused; False: answering again."""
        self._down = down
        if down:
            self._loop.call_soon_threadsafe(self._drop_all)

    def _drop_all(self) -> None:
        for writer in list(self._open):
            writer.close()

    async def _connection(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self._down:
            client_w.close()
            return
        try:
            up_r, up_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_w.close()
            return
        self._open.update((client_w, up_w))
        try:
            await asyncio.gather(self._delayed(client_r, up_w), self._pipe(up_r, client_w), return_exceptions=True)
        except asyncio.CancelledError:  # the relay closing: asyncio would log a cancelled connection as an error
            client_w.close()
        finally:
            self._open.difference_update((client_w, up_w))

    async def _delayed(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Client -> server: each chunk sent ``delay`` after it arrived."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue()

        async def send() -> None:
            while True:
                due, data = await queue.get()
                if data is None:
                    break
                await asyncio.sleep(max(0.0, due - loop.time()))
                writer.write(data)
                await writer.drain()
            writer.close()

        sender = loop.create_task(send())
        try:
            while data := await reader.read(1 << 16):
                queue.put_nowait((loop.time() + self.delay, data))
        finally:
            queue.put_nowait((0.0, None))
            await sender

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1 << 20):
                self.answered += len(data)
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    async def _shutdown(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._loop.stop()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        self._thread.join(5)

    def __enter__(self) -> LatencyRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
