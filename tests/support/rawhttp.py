"""Raw loopback HTTP/1.1 servers for client tests: each connection runs a handler that reads
requests and writes whatever bytes the test wants, the way hostile or broken servers answer
(rsnotify/outbound.py's tests: the hub's deliveries and the sync's GETs), and a TLS CA of the
tests' own."""
from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
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
        except asyncio.CancelledError:
            # the test's loop ends with the connection still open (a handler that never answers):
            # end normally, because Python 3.11's start_server asks a cancelled connection task
            # for its exception and logs "Exception in callback ... CancelledError" for it
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


@dataclass
class Certificates:
    ca_file: Path
    server: ssl.SSLContext
    names_seen: list[str | None]


def make_certificates(folder: Path) -> Certificates:
    """A CA of the test's own and a server certificate from it for localhost and 127.0.0.1, in `folder`."""
    now = datetime.datetime.now(datetime.UTC)

    def certificate(subject: str, key, issuer: str, issuer_key, *, ca: bool) -> x509.Certificate:
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(hours=1))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if ca:
            builder = builder.add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False),
                                            critical=True)
        else:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = certificate("rsnotify test CA", ca_key, "rsnotify test CA", ca_key, ca=True)
    leaf = certificate("localhost", leaf_key, "rsnotify test CA", ca_key, ca=False)
    (folder / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (folder / "leaf.pem").write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    (folder / "leaf.key").write_bytes(leaf_key.private_bytes(serialization.Encoding.PEM,
                                                             serialization.PrivateFormat.PKCS8,
                                                             serialization.NoEncryption()))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(folder / "leaf.pem", folder / "leaf.key")
    seen: list[str | None] = []
    server.sni_callback = lambda sock, name, context: seen.append(name)   # type: ignore[assignment, misc]
    return Certificates(folder / "ca.pem", server, seen)


# -- what the client tests' fixtures are made of


def _uvloop_loop() -> asyncio.AbstractEventLoop:
    import uvloop       # here, not at import: only the client tests run on it
    return uvloop.new_event_loop()


# The loops the outbound client's tests run on, by name: their transports differ in how they report
# a peer's close and a write after it, and the hub's worker runs on uvloop. tests/conftest.py hands
# them to pytest-asyncio (its pytest_asyncio_loop_factories hook); a module runs each test on both
# with `pytestmark = pytest.mark.asyncio(loop_factories=LOOPS)`.
LOOP_FACTORIES: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop, "uvloop": _uvloop_loop}
LOOPS = tuple(LOOP_FACTORIES)


@contextlib.asynccontextmanager
async def raw_servers() -> AsyncIterator[Callable[..., Awaitable[RawServer]]]:
    """start(handler, ssl_context=None) -> a running RawServer; all of them stopped at the end."""
    servers: list[RawServer] = []

    async def start(handler: Handler, ssl_context: ssl.SSLContext | None = None) -> RawServer:
        server = await RawServer(handler).start(ssl_context)
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            await server.stop()
