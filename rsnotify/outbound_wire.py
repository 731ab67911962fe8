"""One keep-alive HTTP/1.1 connection of rsnotify's outbound client (outbound.py): it writes
a request and reads the answer with llhttp (httptools), keeping at most N body bytes.

No pooling, no name resolution, no address checks here: outbound.py does those. The answer is
parsed by llhttp rather than framing code of our own: a subscriber's or a Source's answer is
untrusted input (garbage status lines, duplicate or conflicting Content-Length, bad chunk sizes,
smuggling tricks), and a parser that Node.js runs on every request has met far more of those than we will.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import httptools

# Most bytes an answer may take before its head is complete (1xx heads included): a header
# flood ends here with an error. llhttp keeps no header in memory and we collect none, so the
# check runs per read (uvloop reads up to 256 KiB at once) without any memory at stake.
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 100       # header fields a HeadedConnection keeps; more end the exchange with an error
# Bytes after the head that carry no body (chunk-size lines, chunk extensions, trailers) an
# answer may send in a row: past them it ends with an error. Without this bound a Source could
# keep a GET open forever, every read in time, by sending framing that never delivers a byte of
# the body, and httptools would hold a trailer's value in memory however long it grew.
MAX_FRAMING_BYTES = 64 * 1024
# Body bytes a streamed answer keeps while nobody reads them yet (its reader is still opening a
# file, say); past them the socket is not read until the reader comes (TCP flow control).
PAUSE_AT = 1024 * 1024


class Connection(asyncio.Protocol):
    """A transport's protocol: one request at a time, one answer parsed per request.

    The state of the current exchange (status, body, failure) is read by outbound.py once the
    waiter is done; `is_reusable` says whether the connection may carry another request.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.origin: Any = None         # what the pool files it under (outbound._Origin)
        # one parser for the connection's life: llhttp starts the next message by itself
        self._parser = httptools.HttpResponseParser(self)
        self.is_open = False
        self.requests = 0               # requests written on it (a reused connection has > 0 before)
        self.idle_since = 0.0           # loop time it went back to the pool
        self._waiter: asyncio.Future[None] | None = None
        self.status: int | None = None  # the final status (1xx interim answers are skipped)
        self._interim = False
        self._parts: list[bytes] = []
        self._room = 0                  # body bytes still kept; below 0: the body went past the limit
        self.received = 0               # bytes of this exchange's answer so far
        self.is_complete = False        # llhttp saw the whole answer (on_message_complete)
        self._is_past_end = False       # llhttp went on to bytes after the answer (not ours to read)
        self._keep_alive = False
        self.failure = ""               # why no status came (or why the answer was cut), for the caller
        self.timed_out = False
        self._framing = 0               # bytes after the head since the last body byte (MAX_FRAMING_BYTES)
        # open() (streamed answers) only: a future done at the final head, the body's reader, the
        # loop's clock for an inactivity timeout, and the loop time of the last read
        self.head_waiter: asyncio.Future[None] | None = None
        self._sink: Callable[[bytes], bool] | None = None
        self._max_body = 0
        self.is_paused = False
        self.clock: Callable[[], float] | None = None
        self.last_read = 0.0
        self.read_timed_out = False
        self._timer: asyncio.TimerHandle | None = None
        # request()'s deadline: one timer for the connection's life, moved on only when it fires
        # (see `arm`), and the loop time of the current exchange's end (None: no exchange)
        self._deadline: float | None = None
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._deadline_timer_at = 0.0
        # the slow-answer floor (`watch`'s min_rate): when the current window began, and the
        # bytes received by then
        self._window_start = 0.0
        self._window_received = 0
        self._min_rate: float | None = None
        self.too_slow = False

    # -- what outbound.py calls

    def begin(self, waiter: asyncio.Future[None], max_body: int) -> None:
        """Start an exchange: the answer's state is reset and `waiter` is done when it ends."""
        self._waiter = waiter
        self.status, self._interim, self._parts, self._room = None, False, [], max_body
        self.received, self.is_complete, self._keep_alive, self.failure, self.timed_out = 0, False, False, "", False
        self._is_past_end = False
        self._framing = 0
        self.requests += 1
        self.head_waiter = self._sink = None
        self.clock, self.read_timed_out, self.too_slow = None, False, False

    def begin_streamed(self, waiter: asyncio.Future[None], head_waiter: asyncio.Future[None], max_body: int,
                       clock: Callable[[], float] | None) -> None:
        """Start an exchange whose body is read after its head: `head_waiter` is done at the final
        head (or at the end, if none comes), `waiter` when the exchange ends. With `clock` (the
        loop's), reads are timed for `watch`."""
        self.begin(waiter, max_body)
        self.head_waiter, self._max_body, self.clock = head_waiter, max_body, clock
        if clock is not None:
            self.last_read = self._window_start = clock()
            self._window_received = 0

    def attach(self, sink: Callable[[bytes], bool]) -> None:
        """Hand the body to `sink` from now on (the bytes kept so far first); `sink` returns False
        to stop reading (the exchange then ends and the connection is closed)."""
        parts, self._parts = self._parts, []
        self._sink = sink
        for part in parts:
            if not sink(part):
                self._stop()
                return
        if self.is_paused and self.transport is not None:
            self.is_paused = False
            self.transport.resume_reading()
            if self.clock is not None:
                # the time paused for our reader is not the server's slowness: the rate floor's
                # window starts again here
                self._window_start, self._window_received = self.clock(), self.received

    def watch(self, loop: asyncio.AbstractEventLoop, read_timeout: float | None, deadline: float | None,
              min_rate: float | None = None) -> None:
        """End the exchange when no byte came for `read_timeout` s (while the body is not
        paused for its reader), when fewer than `min_rate` bytes a second came over a window of
        at least `read_timeout` s, or at `deadline` (loop time); None: no such bound."""
        if read_timeout is None:
            if deadline is not None:
                self._timer = loop.call_at(deadline, self.expire)
            return
        self._min_rate = min_rate
        self._timer = loop.call_at(self._next_check(read_timeout, deadline), self._check, loop, read_timeout,
                                   deadline)

    def arm(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        """End the current exchange at `deadline` (loop time) unless `disarm` comes first.

        The connection keeps one timer, armed at the earliest deadline it may need and moved on
        to the current one only when it fires: a keep-alive connection carries a delivery every
        few hundred µs, and a timer created and cancelled per request cost ~3 µs on uvloop, a
        tenth of the worker's CPU for a request."""
        self._deadline = deadline
        timer = self._deadline_timer
        if timer is None or self._deadline_timer_at > deadline:
            if timer is not None:
                timer.cancel()
            self._deadline_timer = loop.call_at(deadline, self._deadline_passed, loop)
            self._deadline_timer_at = deadline

    def disarm(self) -> None:
        """The exchange `arm` bounded is over (its timer stays, for the next one)."""
        self._deadline = None

    def _deadline_passed(self, loop: asyncio.AbstractEventLoop) -> None:
        self._deadline_timer = None
        deadline = self._deadline
        if deadline is None or not self.is_open:
            return                          # no exchange in flight: the next one arms a timer anew
        # a loop's timers fire to the millisecond, possibly a hair before the time asked for
        if loop.time() >= deadline - 0.001:
            self.expire()
        else:
            self._deadline_timer = loop.call_at(deadline, self._deadline_passed, loop)
            self._deadline_timer_at = deadline

    def unwatch(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _next_check(self, read_timeout: float, deadline: float | None) -> float:
        when = self.last_read + read_timeout
        return when if deadline is None else min(when, deadline)

    def _check(self, loop: asyncio.AbstractEventLoop, read_timeout: float, deadline: float | None) -> None:
        # One timer per exchange, moved on only when it fires: a read costs a clock call, not a
        # timer's cancel and re-arm.
        now = loop.time()
        if deadline is not None and now >= deadline:
            self.expire()
            return
        if self.is_paused:
            self.last_read = now         # waiting for our reader is not the server's silence
            self._window_start, self._window_received = now, self.received
        if now - self.last_read >= read_timeout:
            self.read_timed_out = True
            self.expire()
            return
        if self._min_rate is not None and now - self._window_start >= read_timeout:
            # A read in time is not enough: one byte every read_timeout - 1 s would hold the
            # GET (and its worker) forever. Like curl's --speed-limit/--speed-time, each window
            # of at least read_timeout s must bring min_rate bytes a second, head and framing
            # included; so an answer lasts at most about its size / min_rate.
            if self.received - self._window_received < self._min_rate * (now - self._window_start):
                self.too_slow = True
                self.expire()
                return
            self._window_start, self._window_received = now, self.received
        self._timer = loop.call_at(self._next_check(read_timeout, deadline), self._check, loop, read_timeout,
                                   deadline)

    @property
    def body(self) -> bytes:
        return b"".join(self._parts)

    @property
    def waiter(self) -> asyncio.Future[None] | None:
        """Done when the current exchange ends."""
        return self._waiter

    @property
    def is_stopped(self) -> bool:
        """The body went past the limit, or its reader stopped it: the rest was not read."""
        return self._room < 0

    @property
    def body_received(self) -> int:
        """Body bytes of a streamed exchange so far (counted up to where reading stopped)."""
        return self._max_body - self._room

    @property
    def is_reusable(self) -> bool:
        """A fully framed answer on a connection both sides keep open, nothing left over."""
        return (self.is_complete and self._keep_alive and self.is_open and self._room >= 0
                and not self._is_past_end)

    def expire(self) -> None:
        """The exchange's deadline passed (a loop timer calls this)."""
        self.timed_out = True
        self.close()
        self._end()

    def close(self) -> None:
        self.is_open = False
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        if self.transport is not None:
            self.transport.close()

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)   # uvloop's transports are not its subclasses
        self.is_open = True

    def data_received(self, data: bytes) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            # bytes nobody asked for (after a complete answer, or on an idle connection): the
            # peer does not speak HTTP/1.1 the way we do; never read a next answer from it
            self.close()
            return
        self.received += len(data)
        if self.clock is not None:
            self.last_read = self.clock()
        after_head, room = self.status is not None, self._room
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.close()                    # 101: the answer is complete, the protocol would change
        except httptools.HttpParserError as exc:
            self.close()
            if not self.is_complete:
                # a bad chunk size or trailer after the head: still a clear reason, never "closed"
                self._fail(f"invalid HTTP answer{'' if self.status is None else ' body'}: {exc}")
            # after a complete answer: bytes beyond it; the answer stands, the connection goes
        if self.status is None and self.received > MAX_HEAD_BYTES and not waiter.done():
            self.close()
            self._fail(f"answer's head is over {MAX_HEAD_BYTES // 1024} KiB")
        elif after_head and not waiter.done():
            # a read wholly after the head that moved no body byte is framing (or trailers)
            self._framing = 0 if self._room != room else self._framing + len(data)
            if self._framing > MAX_FRAMING_BYTES:
                self.close()
                self._fail(f"answer sent over {MAX_FRAMING_BYTES // 1024} KiB of chunk framing or trailers "
                           "without a byte of its body")
        elif self._room < 0 or self._is_past_end:
            self.close()                    # past the body limit (the rest is never read) or past the answer
            self._end()

    def eof_received(self) -> bool:
        self.is_open = False
        return False                        # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.is_open = False
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if self.status is None:
                self._fail("connection closed before an answer" if self.received == 0
                           else "connection closed before the answer's head was complete")
            else:
                self._end()                 # a body read until the close, or cut short: the status stands

    # -- llhttp callbacks (httptools calls them by name)

    def on_message_begin(self) -> None:
        if self.is_complete:
            # a second answer in the same read as the first: a request we never sent would be
            # answered by it (response smuggling); it must change nothing, and the connection goes
            self._is_past_end = True

    def on_headers_complete(self) -> None:
        if self._is_past_end:
            return
        status = self._parser.get_status_code()
        # 1xx other than 101 are interim answers (100 Continue, 103 Early Hints): the final one follows
        self._interim = status < 200 and status != 101
        if not self._interim:
            self.status = status
            head_waiter = self.head_waiter
            if head_waiter is not None and not head_waiter.done():
                head_waiter.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self._is_past_end:
            return
        room = self._room
        sink = self._sink
        if sink is not None:
            self._room = room - len(body)
            if room < len(body) or not sink(body):
                self._room = -1             # past the limit, or the reader stopped: read no more
            return
        if room > 0:
            self._parts.append(body if len(body) <= room else body[:room])
        self._room = room - len(body)
        if self.head_waiter is not None and self._max_body - self._room > PAUSE_AT and not self.is_paused:
            self.is_paused = True           # nobody reads it yet: let TCP hold the rest
            if self.transport is not None:
                self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self._is_past_end:
            return
        if self._interim:
            self._interim = False
            return
        self.is_complete = True
        self._keep_alive = self._parser.should_keep_alive() and self.status != 101
        self._end()

    # -- ending an exchange

    def _fail(self, reason: str) -> None:
        self.failure = reason
        self._end()

    def _stop(self) -> None:
        self._room = -1
        self.close()
        self._end()

    def _end(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        head_waiter = self.head_waiter
        if head_waiter is not None and not head_waiter.done():
            head_waiter.set_result(None)


class HeadedConnection(Connection):
    """A Connection that keeps the answer's header fields (at most MAX_HEADERS, names in lower
    case; a repeated field's values joined with ", "): for clients that read them (the sync's
    GETs). A class of its own, since llhttp calls `on_header` for every field of every answer
    when the protocol has one, which the hub's deliveries would pay for nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.headers: dict[str, str] = {}
        self._field_bytes = 0
        self._fields = 0                # fields seen, a repeated one counted each time

    def begin(self, waiter: asyncio.Future[None], max_body: int) -> None:
        super().begin(waiter, max_body)
        self.headers = {}
        self._field_bytes = self._fields = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._is_past_end or self.status is not None:
            return                          # trailers of a chunked body, or a next answer's: not kept
        headers = self.headers
        # what is kept is bounded whatever the reads: a head that came in one read of 256 KiB
        # passes data_received's check, which looks only between reads
        # a repeated field counts each time, with its ", ": joining 10,000 copies of one name is
        # no cheaper to keep (or to build, a join per copy) than 10,000 names
        self._field_bytes += len(name) + len(value) + 2
        self._fields += 1
        if self._fields > MAX_HEADERS or self._field_bytes > MAX_HEAD_BYTES:
            self.close()
            self._fail(f"answer has more than {MAX_HEADERS} header fields" if self._fields > MAX_HEADERS
                       else f"answer's head is over {MAX_HEAD_BYTES // 1024} KiB")
            self._is_past_end = True        # the rest of this answer changes nothing
            return
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        if self._interim:
            self.headers = {}               # a 1xx's fields are not the final answer's
            self._field_bytes = self._fields = 0
