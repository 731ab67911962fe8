"""What proves access: the record of the secret key this Redis uses, and subscribers' diagnostics tokens."""
from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from ..keys import (
    diagnostics_sent_key,
    diagnostics_token_key,
    key_check_key,
)
from ..records import (
    text,
)


async def key_check_token(redis: Redis, proposed: bytes) -> bytes | None:
    """The token recording which secret key this Redis's secrets use (`proposed` on first use)."""
    await redis.set(key_check_key(), proposed, nx=True)
    token: Any = await redis.get(key_check_key())
    return token


async def diagnostics_token_digest(redis: Redis, sid: str) -> str | None:
    """The sha256 hex of the subscription's current diagnostics token (None: none, or expired)."""
    stored = await redis.get(diagnostics_token_key(sid))
    return None if stored is None else text(stored)


async def mark_diagnostics_link_sent(redis: Redis, sid: str, interval: int) -> bool:
    """True when no diagnostics link went to the callback within `interval` s (and now one may)."""
    return bool(await redis.set(diagnostics_sent_key(sid), 1, nx=True, ex=interval))


async def keep_diagnostics_token(redis: Redis, sid: str, digest: str, ttl: int) -> None:
    """Keep the digest of a new diagnostics token for `ttl` s (the previous token stops working)."""
    await redis.set(diagnostics_token_key(sid), digest, ex=ttl)
