"""rsnotify's lean HTTP/1.1 client: a keep-alive pool per (scheme, host, port), the
outbound-address guard on the very address each socket connects to, TLS with verification,
bounded in time and in the answer's size. The hub sends its deliveries, verifications, denials
and diagnostics links with `request()` and fetches thin-pinged topics with `open()`; a
Destination's sync GETs a Source's resources with `open()`, which hands back the answer's head
and streams its body.

It sends what the caller gives; it never follows redirects, keeps no cookies and reads no
proxy settings. `request()` reads at most `Limits.max_body` bytes of the answer, decodes no
content coding, and returns every failure as an `Answer` with an `error`, never as an exception.
The wire side of one connection (llhttp) is outbound_wire.py.
"""
from __future__ import annotations

import asyncio
import base64
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from yarl import URL

from rsnotify.netguard import Network, is_allowed_address, refusal_message

from .outbound_answer import RequestFailedError, Response
from .outbound_wire import Connection, HeadedConnection

__all__ = ["Answer", "HeaderLines", "Limits", "OutboundClient", "RequestFailedError", "Response"]

DEFAULT_PORTS = {"http": 80, "https": 443}
DNS_TTL = 60.0          # s a host name's addresses are kept (as aiohttp's ttl_dns_cache=60 did)
IDLE_SECONDS = 15.0     # s an idle connection is kept (aiohttp's keepalive_timeout, what the worker had)
MAX_ORIGINS = 10_000    # origins remembered; past it, those without idle connections are forgotten

AddrInfo = tuple[Any, ...]
OriginKey = tuple[str, str, "int | None"]
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Limits:
    """How long a request may take and how much of its answer is read."""

    connect_timeout: float       # s to resolve, connect and finish the TLS handshake
    # s for the whole request, from the call to the end of the answer; None (open() only): no
    # bound on the whole, as a big resource may take long while it keeps coming
    total_timeout: float | None
    max_body: int                # bytes of the answer's body read (coded, for open()); past them the rest is not
    # open() only: s without a byte of the answer, from the request sent to the body's end
    read_timeout: float | None = None
    # open() only, with read_timeout: bytes a second the answer must bring over each window of at
    # least read_timeout s (curl's --speed-limit), so a drip that keeps every read in time still
    # ends; None: no floor
    min_rate: float | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """What a request came to. `status` None: no HTTP answer, and `error` says why."""

    status: int | None
    body: bytes = b""            # at most Limits.max_body bytes of it
    error: str = ""
    # the guard refused an address of the host and no other one answered (`error` is then
    # rsnotify.netguard's message alone): a caller that words other failures its own way
    # passes this one on as it is
    is_refused: bool = False


class HeaderLines:
    """Header fields written once as a head's lines ("Name: value\r\n" each) and checked, for
    fields that go with many requests (a notification's go to every subscriber of its topic):
    each request then copies the lines instead of writing and checking every field again.
    ValueError when a name or value holds a line break (it could write headers of its own)."""

    __slots__ = ("text",)

    def __init__(self, headers: Mapping[str, str]) -> None:
        self.text = _header_lines(headers)

    def plus(self, *fields: tuple[str, str]) -> HeaderLines:
        """These lines and the (name, value) `fields` after them."""
        more = HeaderLines.__new__(HeaderLines)
        more.text = self.text + _header_lines(dict(fields))
        return more


def _header_lines(headers: Mapping[str, str]) -> str:
    lines = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
    # a CR or LF inside a name or value would let it write headers (or a request) of its own
    if lines.count("\n") != len(headers) or lines.count("\r") != len(headers):
        raise ValueError("a header name or value holds a line break")
    return lines


def _names_authorization(lines: str) -> bool:
    return any(line.partition(":")[0].lower() == "authorization" for line in lines.split("\r\n"))


def _basic_credentials(url: URL) -> str:
    pair = f"{url.user or ''}:{url.password or ''}"
    try:
        raw = pair.encode("latin-1")     # what aiohttp's BasicAuth encodes with
    except UnicodeEncodeError:
        raw = pair.encode()
    return "Basic " + base64.b64encode(raw).decode("ascii")


class _Origin:
    """One (scheme, host, port): its Host header, its idle connections, its resolved addresses."""

    __slots__ = ("host", "host_header", "idle", "infos", "key", "port", "resolved_until", "resolving", "scheme")

    def __init__(self, key: OriginKey, scheme: str, host: str, port: int, host_header: str) -> None:
        self.key, self.scheme, self.host, self.port, self.host_header = key, scheme, host, port, host_header
        self.idle: list[Connection] = []            # a stack: the freshest is reused first
        self.infos: list[AddrInfo] = []
        self.resolved_until = 0.0
        self.resolving: asyncio.Future[list[AddrInfo]] | None = None


class OutboundClient:
    """A keep-alive HTTP/1.1 client: at most `limit` connections open (busy or idle), at most
    `max_idle` of them idle, each idle one closed after `idle_seconds`.

    `allowed`: None for any address; else only public addresses and these networks, refused
    with rsnotify.netguard's message and `hint`. `keep_headers`: the answers' header fields are
    kept, which `open()` needs (`request()` reads none, and is quicker without them). `ssl_context`: None for the system's trust
    store (ssl.create_default_context(), so SSL_CERT_FILE works), built at the first https request.
    Use it on one event loop; `close()` it when done.
    """

    def __init__(self, *, allowed: Iterable[Network] | None, hint: str, limit: int = 100, max_idle: int = 100,
                 idle_seconds: float = IDLE_SECONDS, user_agent: str = "",
                 ssl_context: ssl.SSLContext | None = None, keep_headers: bool = False) -> None:
        self._allowed = None if allowed is None else tuple(allowed)
        self._hint = hint
        self._limit = limit
        self._max_idle = max_idle
        self._idle_seconds = idle_seconds
        self._fixed = (f"User-Agent: {user_agent}\r\n" if user_agent else "") + "Accept: */*\r\n"
        self._ssl = ssl_context
        self._origins: dict[OriginKey, _Origin] = {}
        self._open = 0                              # connections open or being opened
        self._idle = 0
        self._slot_waiters: list[asyncio.Future[None]] = []
        self._sweeper: asyncio.TimerHandle | None = None
        self._busy: set[Connection] = set()
        self._closed = False
        self._keep_headers = keep_headers
        self._protocol: type[Connection] = HeadedConnection if keep_headers else Connection

    # -- the public calls

    async def request(self, method: str, url: URL, headers: Mapping[str, str] | HeaderLines, body: bytes,
                      limits: Limits) -> Answer:
        """Send `method url` with `headers` (not Host, Content-Length, Transfer-Encoding or
        Connection: the client writes those; as HeaderLines when the same go to many) and `body`;
        read the answer within `limits`.
        Not for HEAD (its answer's Content-Length frames no body, which llhttp is not told)."""
        if method == "HEAD":
            raise ValueError("OutboundClient.request does not do HEAD")
        if limits.total_timeout is None:
            raise ValueError("OutboundClient.request needs a total timeout")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limits.total_timeout
        try:
            origin = self._origin_of(url)
            head = self._head(method, url, origin, headers, len(body))
            # The subscriber may get a request sent once more (see _on_a_connection); deliveries
            # are at least once, and the notification id in the headers lets it drop a repeat.
            return await self._on_a_connection(
                loop, origin, limits, deadline,
                lambda conn: self._exchange(loop, conn, head, body, limits, deadline))
        except RequestFailedError as exc:
            return Answer(None, b"", str(exc), exc.is_refused)

    async def open(self, method: str, url: URL, headers: Mapping[str, str], limits: Limits) -> Response:
        """Send `method url` with `headers` (as `request()`) and no body; the answer once its
        head came, its body to be read or streamed from the Response, which the caller closes.
        `limits.max_body`: the body's bytes as sent (coded) read at most. RequestFailedError when
        no answer came (`is_refused`: the guard's refusal). The client needs `keep_headers`."""
        if not self._keep_headers:
            raise ValueError("OutboundClient.open needs a client made with keep_headers=True")
        if method == "HEAD":
            raise ValueError("OutboundClient.open does not do HEAD")
        loop = asyncio.get_running_loop()
        deadline = None if limits.total_timeout is None else loop.time() + limits.total_timeout
        origin = self._origin_of(url)
        head = self._head(method, url, origin, headers, 0)
        return await self._on_a_connection(loop, origin, limits, deadline,
                                           lambda conn: self._exchange_head(loop, conn, head, limits, deadline))

    async def close(self) -> None:
        """Close every connection, idle and busy; requests after this fail."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        for origin in self._origins.values():
            for conn in origin.idle:
                conn.close()
            origin.idle.clear()
        for conn in list(self._busy):
            conn.close()
        self._idle = 0
        for waiter in self._slot_waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _on_a_connection(self, loop: asyncio.AbstractEventLoop, origin: _Origin, limits: Limits,
                               deadline: float | None,
                               exchange: Callable[[Connection], Awaitable[_T | None]]) -> _T:
        """`exchange` on an idle connection to `origin`, else a new one. An exchange answers None
        when a reused connection was closed by the server before any byte of an answer (its
        keep-alive timeout raced our request): it runs once more on a fresh connection."""
        fresh = False
        for _ in range(2):
            conn = None if fresh else self._take_idle(origin, loop.time())
            if conn is None:
                conn = await self._connection(loop, origin, limits, deadline, fresh=fresh)
            result = await exchange(conn)
            if result is not None:
                return result
            fresh = True
        raise RequestFailedError("connection closed before an answer")

    # -- building the request

    def _origin_of(self, url: URL) -> _Origin:
        return self._origins.get((url.scheme, url.raw_host or "", url.port)) or self._origin(url)

    def _origin(self, url: URL) -> _Origin:
        scheme, host = url.scheme, url.raw_host or ""
        if scheme not in DEFAULT_PORTS or not host:
            raise RequestFailedError(f"cannot send to {url}: only http:// and https:// URLs with a host")
        port = url.port or DEFAULT_PORTS[scheme]
        name = f"[{host}]" if ":" in host else host
        host_header = name if url.explicit_port is None or url.port == DEFAULT_PORTS[scheme] else f"{name}:{port}"
        if len(self._origins) >= MAX_ORIGINS:
            # a hub with many callback hosts: forget those with nothing pooled (their cached
            # addresses go too); a busy connection of a forgotten origin is closed when it is done
            self._origins = {k: o for k, o in self._origins.items() if o.idle or o.resolving is not None}
        key = (scheme, host, url.port)
        origin = self._origins[key] = _Origin(key, scheme, host, port, host_header)
        return origin

    def _head(self, method: str, url: URL, origin: _Origin, headers: Mapping[str, str] | HeaderLines,
              length: int) -> bytes:
        if isinstance(headers, HeaderLines):
            lines = headers.text
        else:
            try:
                lines = _header_lines(headers)
            except ValueError as exc:
                raise RequestFailedError(f"cannot send: {exc}") from None
        if url.raw_user is not None and not _names_authorization(lines):
            # a callback's user:password@ becomes Basic credentials, as aiohttp made them before;
            # an Authorization given (in any case: `sync --header`) wins, never two of them
            lines += f"Authorization: {_basic_credentials(url)}\r\n"
        target = url.raw_path_qs or "/"
        framing = "" if length == 0 and method == "GET" else f"Content-Length: {length}\r\n"
        return (f"{method} {target} HTTP/1.1\r\nHost: {origin.host_header}\r\n{self._fixed}{lines}"
                f"{framing}\r\n").encode()

    # -- one exchange on one connection

    async def _exchange(self, loop: asyncio.AbstractEventLoop, conn: Connection, head: bytes, body: bytes,
                        limits: Limits, deadline: float) -> Answer | None:
        """The answer on `conn`, or None when a reused connection closed before any byte of it."""
        reused = conn.requests > 0
        waiter: asyncio.Future[None] = loop.create_future()
        conn.begin(waiter, limits.max_body)
        self._busy.add(conn)
        conn.arm(loop, deadline)
        try:
            transport = conn.transport
            if transport is None or transport.is_closing():
                conn.connection_lost(None)
            elif len(body) < 65536:
                transport.write(head + body)         # one write, one segment for a small notification
            else:
                transport.writelines((head, body))
            await waiter
        finally:
            conn.disarm()
            self._busy.discard(conn)
            if not waiter.done():                    # cancelled: the answer is half read
                conn.close()
            if conn.is_reusable and not self._closed:
                self._put_idle(conn, loop.time())
            else:
                self._discard(conn)
        if conn.status is not None:
            return Answer(conn.status, conn.body)
        if conn.timed_out:
            raise RequestFailedError(f"no answer within {limits.total_timeout:g} s")
        if reused and conn.received == 0:
            return None
        raise RequestFailedError(conn.failure or "connection closed before an answer")

    async def _exchange_head(self, loop: asyncio.AbstractEventLoop, conn: Connection, head: bytes, limits: Limits,
                             deadline: float | None) -> Response | None:
        """The answer on `conn` once its head came, or None when a reused connection closed
        before any byte of it. The Response hands the connection back (`_finish`)."""
        assert isinstance(conn, HeadedConnection)
        reused = conn.requests > 0
        waiter: asyncio.Future[None] = loop.create_future()
        head_waiter: asyncio.Future[None] = loop.create_future()
        read_timeout = limits.read_timeout
        conn.begin_streamed(waiter, head_waiter, limits.max_body, None if read_timeout is None else loop.time)
        self._busy.add(conn)
        conn.watch(loop, read_timeout, deadline, limits.min_rate)
        try:
            transport = conn.transport
            if transport is None or transport.is_closing():
                conn.connection_lost(None)
            else:
                transport.write(head)
            await head_waiter
        except BaseException:
            self._finish(conn)
            raise
        if conn.status is not None:
            return Response(conn, self._finish, lambda ended: _why_cut(ended, limits))
        self._finish(conn)
        if reused and conn.received == 0 and not conn.timed_out:
            return None
        raise RequestFailedError(_why_cut(conn, limits))

    def _finish(self, conn: Connection) -> None:
        """An open() exchange is over: its connection back to the pool when its answer was read
        whole, else closed."""
        conn.unwatch()
        self._busy.discard(conn)
        if conn.is_reusable and not self._closed:
            self._put_idle(conn, asyncio.get_running_loop().time())
        else:
            self._discard(conn)

    # -- the pool

    def _take_idle(self, origin: _Origin, now: float) -> Connection | None:
        idle = origin.idle
        while idle:
            conn = idle.pop()
            self._idle -= 1
            if self._is_usable(conn, now):
                return conn
            self._discard(conn)
        return None

    def _is_usable(self, conn: Connection, now: float) -> bool:
        """An idle connection still open at both ends and idle for less than idle_seconds."""
        return conn.is_open and now - conn.idle_since < self._idle_seconds

    def _put_idle(self, conn: Connection, now: float) -> None:
        origin: _Origin = conn.origin
        if self._idle >= self._max_idle or self._origins.get(origin.key) is not origin:
            self._discard(conn)
            return
        conn.idle_since = now
        origin.idle.append(conn)
        self._idle += 1
        self._wake_one()
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(self._idle_seconds, self._sweep)

    def _discard(self, conn: Connection) -> None:
        conn.close()
        self._release_slot()

    def _release_slot(self) -> None:
        self._open -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self._slot_waiters:
            waiter = self._slot_waiters.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                break

    def _sweep(self) -> None:
        """Close the connections idle for idle_seconds or closed by their server meanwhile."""
        self._sweeper = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        for origin in self._origins.values():
            if origin.idle:
                keep = []
                for conn in origin.idle:
                    if self._is_usable(conn, now):
                        keep.append(conn)
                    else:
                        self._idle -= 1
                        self._discard(conn)
                origin.idle[:] = keep
        if self._idle and not self._closed:
            self._sweeper = loop.call_later(self._idle_seconds / 3, self._sweep)

    async def _take_slot(self, loop: asyncio.AbstractEventLoop, origin: _Origin | None) -> Connection | None:
        """Count one more open connection (None), or, while waiting at `limit`, an idle connection
        of `origin` that came back meanwhile. At `limit`, the oldest idle connection of another
        origin is closed first; only when there is none, the request waits."""
        while not self._closed:
            conn = None if origin is None else self._take_idle(origin, loop.time())
            if conn is not None:
                return conn
            if self._open < self._limit:
                self._open += 1
                return None
            oldest = min((o for o in self._origins.values() if o.idle), key=lambda o: o.idle[0].idle_since,
                         default=None)
            if oldest is not None:
                self._idle -= 1
                self._discard(oldest.idle.pop(0))
                continue
            waiter: asyncio.Future[None] = loop.create_future()
            self._slot_waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._slot_waiters:
                    self._slot_waiters.remove(waiter)
        raise RequestFailedError("the outbound client is closed (its owner is stopping)")

    # -- connecting

    async def _connection(self, loop: asyncio.AbstractEventLoop, origin: _Origin, limits: Limits,
                          deadline: float | None, *, fresh: bool) -> Connection:
        """A new connection to `origin` through the guard, within the connect timeout; or, unless
        `fresh`, an idle one that came back while this request waited for room in the pool."""
        try:
            async with asyncio.timeout_at(deadline):
                idle = await self._take_slot(loop, None if fresh else origin)
        except TimeoutError:
            raise RequestFailedError(f"no answer within {limits.total_timeout:g} s") from None
        if idle is not None:
            return idle
        connect_by = loop.time() + limits.connect_timeout
        if deadline is not None:
            connect_by = min(deadline, connect_by)
        try:
            async with asyncio.timeout_at(connect_by):
                conn = await self._connect_any(loop, origin, await self._addresses(loop, origin))
        except TimeoutError:
            self._release_slot()
            if deadline is not None and connect_by >= deadline:
                raise RequestFailedError(f"no answer within {limits.total_timeout:g} s") from None
            raise RequestFailedError(f"no connection within {limits.connect_timeout:g} s (connect timeout)") from None
        except BaseException:
            self._release_slot()
            raise
        conn.origin = origin
        return conn

    async def _addresses(self, loop: asyncio.AbstractEventLoop, origin: _Origin) -> list[AddrInfo]:
        """The host's addresses, from a cache kept DNS_TTL seconds; one lookup at a time per host."""
        if origin.resolved_until > loop.time():
            return origin.infos
        if origin.resolving is None:
            origin.resolving = resolving = loop.create_future()
            try:
                infos = await loop.getaddrinfo(origin.host, origin.port, type=socket.SOCK_STREAM)
            except (OSError, UnicodeError) as exc:   # UnicodeError: a name the idna codec refuses
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                resolving.set_exception(RequestFailedError(f"host name not found: {origin.host} ({reason})"))
                resolving.exception()                # retrieved: the waiters, if any, raise it too
            except BaseException:
                resolving.cancel()                   # timed out or cancelled: the waiters see it
                raise
            else:
                origin.infos, origin.resolved_until = list(infos), loop.time() + DNS_TTL
                resolving.set_result(origin.infos)
            finally:
                origin.resolving = None
            return resolving.result()
        return await asyncio.shield(origin.resolving)

    async def _connect_any(self, loop: asyncio.AbstractEventLoop, origin: _Origin,
                           infos: list[AddrInfo]) -> Connection:
        """Connect to the first address that is allowed and answers; a refusal outranks other errors."""
        refusal = failure = ""
        for family, type_, proto, _, sockaddr in infos:
            address = str(sockaddr[0])
            # judged on the very address the socket connects to: no second lookup can swap it
            if self._allowed is not None and not is_allowed_address(address, self._allowed):
                refusal = refusal or refusal_message(address, self._hint)
                continue
            try:
                return await self._open_socket(loop, origin, family, type_, proto, sockaddr)
            except ssl.SSLCertVerificationError as exc:
                failure = f"TLS failed with {origin.host}: certificate verify failed ({exc.verify_message})"
            except ssl.SSLError as exc:
                failure = f"TLS failed with {origin.host}: {exc.reason or exc}"
            except ConnectionRefusedError:
                failure = f"connection refused by {address} port {origin.port}"
            except OSError as exc:
                failure = f"cannot connect to {address} port {origin.port}: {exc.strerror or exc}"
        if refusal:
            raise RequestFailedError(refusal, is_refused=True)
        raise RequestFailedError(failure or f"host name not found: {origin.host} (no address)")

    async def _open_socket(self, loop: asyncio.AbstractEventLoop, origin: _Origin, family: int, type_: int,
                           proto: int, sockaddr: tuple[Any, ...]) -> Connection:
        sock = socket.socket(family, type_, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_connect(sock, sockaddr)
            tls: dict[str, Any] = {}
            if origin.scheme == "https":
                if self._ssl is None:
                    self._ssl = ssl.create_default_context()
                tls = {"ssl": self._ssl, "server_hostname": origin.host}
            _, conn = await loop.create_connection(self._protocol, sock=sock, **tls)
        except BaseException:
            sock.close()
            raise
        return conn


def _why_cut(conn: Connection, limits: Limits) -> str:
    """Why an open() exchange ended without its whole answer."""
    if conn.read_timed_out:
        return f"no data for {limits.read_timeout:g} s (read timeout)"
    if conn.too_slow:
        return (f"under {limits.min_rate:g} bytes/s for {limits.read_timeout:g} s or more "
                f"(too slow; {conn.received} bytes of the answer came)")
    if conn.timed_out:
        return f"no whole answer within {limits.total_timeout:g} s"
    if conn.failure:
        return conn.failure
    if conn.status is None:
        return "connection closed before an answer"
    return f"connection closed after {conn.body_received} bytes of the body, before its end"
