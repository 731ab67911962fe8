"""Raw loopback HTTP/1.1 servers for client tests: each connection runs a handler that reads
requests and writes whatever bytes the test wants, the way hostile or broken servers answer
(rsnotify/outbound.py's tests: the hub's deliveries and the sync's GETs)."""
from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from yarl import URL

from tests.support.ports import free_port

Handler = Callable[["RawServer", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """(head, body) of one request (Content-Length framed), or (b"", b"") at the end of the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return b"", b""
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    return head, await reader.readexactly(length)


@dataclass
class RawServer:
    """A loopback TCP server running `handler` per connection, counting connections and requests."""

    handler: Handler
    port: int = 0
    connections: int = 0
    open_now: int = 0
    most_open: int = 0
    requests: list[tuple[bytes, bytes]] = field(default_factory=list)
    closed_by_client: int = 0
    server: asyncio.Server | None = None

    async def start(self, ssl_context: ssl.SSLContext | None = None) -> RawServer:
        self.port = free_port()
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, ssl=ssl_context)
        return self

    def url(self, path: str = "/cb", scheme: str = "http", host: str = "127.0.0.1") -> URL:
        return URL(f"{scheme}://{host}:{self.port}{path}", encoded=True)   # as hub.callbacks.delivery_url

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        try:
            await self.handler(self, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.open_now -= 1
            writer.close()

    async def next_request(self, reader: asyncio.StreamReader) -> bool:
        head, body = await read_request(reader)
        if not head:
            self.closed_by_client += 1
            return False
        self.requests.append((head, body))
        return True

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()


def answering(*answers: bytes, then_close: bool = False) -> Handler:
    """Answer each request on a connection with the next of `answers` (the last one repeats)."""
    async def handler(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = 0
        while await server.next_request(reader):
            writer.write(answers[min(n, len(answers) - 1)])
            await writer.drain()
            n += 1
            if then_close:
                return
    return handler
