"""A TCP proxy between agents and the broker, so tests can cut the network."""

from __future__ import annotations

import asyncio
import contextlib
import socket


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._server: asyncio.Server | None = None
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._pumps: set[asyncio.Task[None]] = set()
        self.refuse = False
        self.port = 0
        # Holds the port while unplugged: a bound socket that does not listen answers
        # connections with a reset (as a host whose broker is down), and no other socket
        # on the machine can take the port in the meantime, so `plug` always gets it back.
        self._reservation: socket.socket | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> None:
        """Listen on `port` (0: any free one; `port` says which)."""
        if self._reservation is None:
            self._reservation = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._reservation.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._reservation.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            self._reservation.bind(("127.0.0.1", port or self.port))
            self.port = self._reservation.getsockname()[1]
        self._server = await asyncio.start_server(
            self._accept, "127.0.0.1", self.port, reuse_port=True
        )

    async def unplug(self) -> None:
        """Cut every connection and stop listening: new connections are refused, as
        when the broker's host is down (`refuse` instead accepts and drops them, which
        a client notices only when its connect times out)."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        self.cut()

    async def plug(self) -> None:
        """Listen again on the same port."""
        await self.start()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refuse:
            writer.transport.abort()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        link = (writer, upstream_writer)
        self._links.add(link)
        for source, sink in ((reader, upstream_writer), (upstream_reader, writer)):
            task = asyncio.create_task(self._pump(source, sink))
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)

    @staticmethod
    async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        sink.transport.abort()

    def cut(self) -> int:
        """Abort every open connection (like a network failure); return how many."""
        links = list(self._links)
        self._links.clear()
        for client_side, broker_side in links:
            client_side.transport.abort()
            broker_side.transport.abort()
        return len(links)

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._pumps):
            task.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        if self._reservation is not None:
            self._reservation.close()
            self._reservation = None
