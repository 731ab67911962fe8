"""Every Redis client of the hub's processes is built here (web, worker, RQ, the rate limiter,
the embedded admin paths), from one RedisTarget: a redis://, rediss://, unix:// or Sentinel URL
plus the TLS files, the Sentinel password and the timeout.

Pools wait for a free connection (bounded) instead of failing: a burst of work queues up for
connections, where redis-py's default pool (redis-py 8: 100 connections) raises
MaxConnectionsError and fails the job or request that asked.

A server that answers READONLY is a demoted primary: the connection is dropped and the command
fails as a ConnectionError, so the next connection asks the Sentinels (or DNS, for a managed
service's endpoint) for the primary again. No write is ever taken by a replica.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Any

import redis as redis_sync
import redis.asyncio as redis_async
import redis.asyncio.sentinel as sentinel_async
import redis.sentinel as sentinel_sync
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.connection import HiredisRespSerializer
from redis.driver_info import DriverInfo
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.asyncio.retry import Retry as AsyncRetry
from redis.retry import Retry
from redis.utils import HIREDIS_AVAILABLE, get_lib_version

from .redis_url import RedisAddress, parse_redis_url
from .settings import HubSettings

POOL_WAIT = 30.0        # s a command waits for a free connection before it fails
ROLE_CHECK_EVERY = 1.0  # s between two questions to the Sentinels: which server is the primary now?
ROLE_CHECK_TIMEOUT = 0.5  # s a command waits for that answer before it goes on with what it knows
DEMOTED = "the Redis server is now a replica (READONLY); reconnecting to the primary"


@dataclass(frozen=True)
class RedisTarget:
    """Where the hub's Redis is and how to reach it. `timeout` bounds connecting (and, for the
    web process's clients, every command): past it the command fails and a request gets 503."""

    address: RedisAddress
    sentinel_password: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    timeout: float = 5.0

    @classmethod
    def of(cls, settings: HubSettings, url: str | None = None) -> RedisTarget:
        """The target of `url` (default: settings.redis_url) with the settings' TLS, Sentinel
        password and --redis-timeout. SettingsError for a bad URL."""
        chosen = url or settings.redis_url
        if chosen is None:
            raise ValueError("RedisTarget.of needs a URL: settings.redis_url is not set")
        return cls(parse_redis_url(chosen), settings.sentinel_password, settings.redis_ca_file,
                   settings.redis_cert_file, settings.redis_key_file, settings.redis_timeout)

    @property
    def shown(self) -> str:
        return self.address.shown


Target = RedisTarget | str


def _target(target: Target, connect_timeout: float | None = None) -> RedisTarget:
    chosen = target if isinstance(target, RedisTarget) else RedisTarget(parse_redis_url(target))
    return chosen if connect_timeout is None else replace(chosen, timeout=connect_timeout)


# --- connections that notice a demoted primary ---------------------------------------------------


class _HiredisPacking:
    """redis-py packs commands with hiredis (C) for its sync connections, but in Python for its
    asyncio ones: ~45 µs for a delivery checkpoint's ~40 arguments against ~10 µs, a few percent
    of a worker's CPU at full fan-out. The same packer (same bytes, same DataError for a value
    Redis cannot take) for the asyncio connections too."""

    def pack_command(self, *args: Any) -> list[bytes]:
        if _HIREDIS is None or _pack is None:
            return super().pack_command(*args)  # type: ignore[misc, no-any-return]
        if type(args[0]) is str and " " not in args[0]:
            # the usual command (a plain name, values hiredis takes as they are): the serializer's
            # own pass over every argument, to split the name and copy buffers, costs more than
            # the packing; anything hiredis refuses (a bytearray, a memoryview) takes that pass
            try:
                return [_pack(args)]
            except TypeError:
                pass
        return _HIREDIS.pack(*args)


_HIREDIS = HiredisRespSerializer() if HIREDIS_AVAILABLE else None
try:
    from hiredis import pack_command as _pack
except ImportError:     # redis-py then packs in Python (HIREDIS_AVAILABLE is False too)
    _pack = None  # type: ignore[assignment]


class _QuickWrites:
    """redis-py's asyncio connections bound every write by socket_timeout (redis-py 8: 5 s by
    default) with asyncio.wait_for, which makes a task and a timer for each command or pipeline
    and runs the write an iteration of the loop later: ~15 µs, about what a worker spends on a
    delivery's own POST, paid by every read of a followed topic's log. A write the transport
    takes whole (its buffer stays empty: nothing to wait for) skips it; one that has to wait for
    room is bounded as before, and failures end the connection as redis-py's do."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        conn: Any = self                 # a redis-py asyncio Connection (this is its mixin)
        writer = conn._writer
        if writer is None or not isinstance(command, list) or not conn.socket_timeout or conn.health_check_interval:
            await super().send_packed_command(command, check_health)  # type: ignore[misc]
            return
        try:
            writer.writelines(command)
            if writer.transport.get_write_buffer_size():
                await asyncio.wait_for(writer.drain(), conn.socket_timeout)
            else:
                await writer.drain()     # returns at once: raises only for a connection already lost
        except TimeoutError:
            await conn.disconnect(nowait=True)
            raise RedisTimeoutError("Timeout writing to socket") from None
        except OSError as exc:
            await conn.disconnect(nowait=True)
            raise RedisConnectionError(f"Error while writing to socket: {exc}") from exc
        except BaseException:
            await conn.disconnect(nowait=True)
            raise


class _AsyncPrimaryConnection(_QuickWrites, _HiredisPacking, redis_async.Connection):
    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except ReadOnlyError:
            await self.disconnect()
            raise RedisConnectionError(DEMOTED) from None


class _AsyncPrimarySSLConnection(_AsyncPrimaryConnection, redis_async.SSLConnection):
    pass


class _AsyncUnixConnection(_QuickWrites, _HiredisPacking, redis_async.UnixDomainSocketConnection):
    pass


class _SyncPrimaryConnection(redis_sync.Connection):
    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)
        except ReadOnlyError:
            self.disconnect()
            raise RedisConnectionError(DEMOTED) from None


class _SyncPrimarySSLConnection(_SyncPrimaryConnection, redis_sync.SSLConnection):
    pass


class _SyncSentinelConnection(sentinel_sync.SentinelManagedConnection):
    # redis-py's sync Sentinel connection keeps a connection whose read was interrupted (its
    # read_response defaults to disconnect_on_error=False, unlike every other connection class):
    # RQ's BLMOVE cut short by SIGTERM then left its reply pending, and the worker's last
    # commands (register_death) waited for it for the rest of the BLMOVE's 405 s
    def read_response(self, *args: Any, disconnect_on_error: bool | None = True, **kwargs: Any) -> Any:
        return super().read_response(*args, disconnect_on_error=disconnect_on_error, **kwargs)


class _SyncSentinelSSLConnection(_SyncSentinelConnection, redis_sync.SSLConnection):
    pass


# --- Sentinel pools that wait, and remember the primaries they saw ---------------------------------


@dataclass
class PrimaryChange:
    """A change of primary this process saw: Sentinel named `new` where it had named `old`."""

    at: float
    old: str
    new: str


class AsyncSentinelPool(sentinel_async.SentinelConnectionPool, redis_async.BlockingConnectionPool):
    """redis-py's Sentinel pool with the waiting behaviour of BlockingConnectionPool, that asks the
    Sentinels at most every ROLE_CHECK_EVERY s which server is the primary, and drops every
    connection to the old one when that changed.

    redis-py asks only when it opens a connection, so without the check a process keeps writing
    to a primary the Sentinels have replaced (cut off from them, it does not know yet) until it
    is demoted: those writes are lost then."""

    last_change: PrimaryChange | None = None
    _checked_at = 0.0

    async def get_connection(self, command_name: Any = None, *keys: Any, **options: Any) -> Any:
        now = time.monotonic()
        if self.master_address is not None and now - self._checked_at >= ROLE_CHECK_EVERY:
            self._checked_at = now
            before = self.master_address
            try:
                # bounded: a Sentinel cut off by the network must not hold the command up
                await asyncio.wait_for(self.get_master_address(), ROLE_CHECK_TIMEOUT)
            except (RedisConnectionError, RedisTimeoutError, TimeoutError):
                pass                    # no Sentinel answers now: the command's own connection tells
            if self.master_address != before:
                await self.disconnect(inuse_connections=True)
        if command_name is None and not keys and not options:
            # redis-py >= 5.3 calls this without arguments and warns (DeprecationWarning) when given
            # any, None included; before 5.3 its callers always name the command
            return await super().get_connection()
        return await super().get_connection(command_name, *keys, **options)

    async def get_master_address(self) -> Any:
        before = self.master_address
        address = await super().get_master_address()
        if before is not None and address != before:
            self.last_change = PrimaryChange(time.time(), _addr(before), _addr(address))
        return address

    async def release(self, connection: Any) -> None:
        # A connection that was busy when a new connection learnt of a new primary still reaches the
        # old one (redis-py drops only the idle ones then, and its asyncio pool, unlike the
        # synchronous one, takes any connection back): dropped here, so it reconnects to the primary.
        if self.master_address is not None and (connection.host, connection.port) != self.master_address:
            await connection.disconnect()
        await super().release(connection)


class SyncSentinelPool(sentinel_sync.SentinelConnectionPool, redis_sync.BlockingConnectionPool):
    """The synchronous twin of AsyncSentinelPool (RQ, the heartbeat, the admin paths)."""

    last_change: PrimaryChange | None = None
    _checked_at = 0.0

    def get_connection(self, command_name: Any = None, *keys: Any, **options: Any) -> Any:
        now = time.monotonic()
        if self.master_address is not None and now - self._checked_at >= ROLE_CHECK_EVERY:
            self._checked_at = now
            before = self.master_address
            try:
                self.get_master_address()
            except RedisConnectionError:
                pass
            if self.master_address != before:
                self.disconnect(inuse_connections=True)
        return super().get_connection(command_name, *keys, **options)

    def get_master_address(self) -> Any:
        before = self.master_address
        address = super().get_master_address()
        if before is not None and address != before:
            self.last_change = PrimaryChange(time.time(), _addr(before), _addr(address))
        return address


def _addr(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


# --- the clients ----------------------------------------------------------------------------------


def _tls_kwargs(target: RedisTarget) -> dict[str, Any]:
    if not target.address.is_tls:
        return {}
    kwargs: dict[str, Any] = {"ssl_ca_certs": target.ca_file, "ssl_certfile": target.cert_file,
                              "ssl_keyfile": target.key_file}
    options = dict(target.address.options)
    if "ssl_cert_reqs" in options:
        kwargs["ssl_cert_reqs"] = options["ssl_cert_reqs"].lower()
    if "ssl_check_hostname" in options:
        kwargs["ssl_check_hostname"] = options["ssl_check_hostname"].lower() in ("1", "true", "yes", "on")
    return kwargs


# What each connection tells the server (CLIENT SETINFO): redis-py 8 looks its own version up in
# the package metadata for every new connection unless given it (~235 us of CPU against ~6 us),
# and a worker opens connections in bursts (concurrent verifications each take one).
_DRIVER = DriverInfo(lib_version=get_lib_version())


def _common_kwargs(target: RedisTarget, command_timeout: bool) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"socket_connect_timeout": target.timeout, "driver_info": _DRIVER}
    if target.address.scheme != "unix":
        kwargs["socket_keepalive"] = True   # a dead peer across a network is noticed, not waited on
    if command_timeout:
        # a request answers 503 past --redis-timeout: one try, bounded; the client retries
        kwargs.update(socket_timeout=target.timeout, retry=Retry(NoBackoff(), 0))
    else:
        # a worker's RQ loop (synchronous client) rides out a failover: a few quick retries
        # across the promotion (async_client replaces this: its commands are never retried)
        kwargs["retry"] = Retry(ExponentialBackoff(cap=1.0, base=0.1), 3)
    return kwargs


def _sentinel_kwargs(target: RedisTarget) -> tuple[list[tuple[str, int]], dict[str, Any], dict[str, Any]]:
    """(sentinels, sentinel_kwargs, data-node kwargs) for a Sentinel target."""
    address = target.address
    tls = _tls_kwargs(target)
    # the Sentinels' own password is not the data nodes' (Sentinel ACLs are separate)
    on_sentinels = {"password": target.sentinel_password, "socket_timeout": target.timeout,
                    "socket_connect_timeout": target.timeout, **({"ssl": True, **tls} if tls else {})}
    data = {"username": address.username, "password": address.password, "db": address.db,
            **({"ssl": True, **tls} if address.is_tls else {})}
    if "client_name" in dict(address.options):
        data["client_name"] = dict(address.options)["client_name"]
    return list(address.sentinels), on_sentinels, data


def async_client(target: Target, max_connections: int, *, command_timeout: bool = False,
                 connect_timeout: float | None = None) -> redis_async.Redis:
    """An asyncio client (bytes replies) owning a waiting pool of at most `max_connections`.
    With `command_timeout` every command fails past the target's timeout (the web process);
    `connect_timeout` replaces the target's timeout (for connecting, and for commands with `command_timeout`)."""
    t = _target(target, connect_timeout)
    common = _common_kwargs(t, command_timeout)
    # An asyncio client never retries a command itself. redis-py's asyncio clients need its
    # asyncio Retry (the synchronous one handed them returns the command's coroutine unawaited:
    # it never retried anything, which the engine has relied on): a command whose reply was lost
    # may have run, and a script such as a claim or an outcome must not run twice. Their callers
    # wait out a failover instead (the reconciler finds unfinished work again).
    common["retry"] = AsyncRetry(NoBackoff(), 0)
    if t.address.is_sentinel:
        sentinels, on_sentinels, data = _sentinel_kwargs(t)
        manager = sentinel_async.Sentinel(sentinels, sentinel_kwargs=on_sentinels, **data, **common)
        client: redis_async.Redis = manager.master_for(
            t.address.service, redis_class=redis_async.Redis, connection_pool_class=AsyncSentinelPool,
            max_connections=max_connections, timeout=POOL_WAIT)
        return client
    connection = _AsyncPrimarySSLConnection if t.address.scheme == "rediss" else _AsyncPrimaryConnection
    extra = _tls_kwargs(t) if t.address.scheme != "unix" else {}
    if t.address.scheme == "unix":
        connection = _AsyncUnixConnection  # type: ignore[assignment]  # one local server
    # as from_url (the URL's options win), but from_url puts its own connection class over ours
    # for unix:// and rediss:// URLs
    options: dict[str, Any] = {"max_connections": max_connections, "timeout": POOL_WAIT, **extra, **common,
                               **redis_async.connection.parse_url(t.address.url), "connection_class": connection}
    return redis_async.Redis.from_pool(redis_async.BlockingConnectionPool(**options))


def sync_client(target: Target, max_connections: int, *, command_timeout: bool = False,
                connect_timeout: float | None = None) -> redis_sync.Redis:
    """A synchronous client (bytes replies) owning a waiting pool of at most `max_connections`."""
    t = _target(target, connect_timeout)
    common = _common_kwargs(t, command_timeout)
    if t.address.is_sentinel:
        sentinels, on_sentinels, data = _sentinel_kwargs(t)
        manager = sentinel_sync.Sentinel(sentinels, sentinel_kwargs=on_sentinels, **data, **common)
        client: redis_sync.Redis = manager.master_for(
            t.address.service, redis_class=redis_sync.Redis, connection_pool_class=SyncSentinelPool,
            connection_class=_SyncSentinelSSLConnection if t.address.is_tls else _SyncSentinelConnection,
            max_connections=max_connections, timeout=POOL_WAIT)
        return client
    connection: type[redis_sync.Connection | redis_sync.UnixDomainSocketConnection]
    connection = _SyncPrimarySSLConnection if t.address.scheme == "rediss" else _SyncPrimaryConnection
    extra = _tls_kwargs(t) if t.address.scheme != "unix" else {}
    if t.address.scheme == "unix":
        connection = redis_sync.UnixDomainSocketConnection
    pool = redis_sync.BlockingConnectionPool.from_url(
        t.address.url, max_connections=max_connections, timeout=POOL_WAIT, connection_class=connection,
        **extra, **common)
    return redis_sync.Redis.from_pool(pool)


async def server_role(client: redis_async.Redis) -> tuple[str, str]:
    """(role, address) of the server one of `client`'s connections reaches: the role that server
    states itself (ROLE: "master", "slave", ...) and the host:port (or socket path) the connection
    reached. /health reports this rather than the pool's name for the primary, which is only what
    the Sentinels said when last asked. A connection that reaches a non-primary is dropped, so the
    next one asks the Sentinels (or DNS) again. Redis errors propagate."""
    pool = client.connection_pool
    connection = await pool.get_connection()
    try:
        # on the connection itself, not client.execute_command: the answer must come with the
        # address of the server that gave it
        await connection.send_command("ROLE")
        reply = await connection.read_response()
        role = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        if role != "master":
            await connection.disconnect()
        return role, _connection_address(connection)
    finally:
        await pool.release(connection)


def _connection_address(connection: Any) -> str:
    path = getattr(connection, "path", None)
    return str(path) if path else f"{connection.host}:{connection.port}"


def last_primary_change(client: redis_async.Redis | redis_sync.Redis) -> PrimaryChange | None:
    """The last change of primary this client's pool saw (Sentinel targets only)."""
    return getattr(client.connection_pool, "last_change", None)
