"""Subscription secrets encrypted at rest with Fernet; the key from settings or the data dir.

Plain secrets exist only in memory, briefly: never logged, never stored, never in a repr.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken
from redis.asyncio import Redis

from . import store
from .errors import SettingsError
from .settings import HubSettings

KEY_FILE = "secret.key"
_KEY_CHECK_PLAINTEXT = b"rsnotify secret key check"


def load_fernet(settings: HubSettings, *, create: bool = True) -> Fernet:
    """The Fernet of --secret-key, else of DATA_DIR/secret.key (generated, mode 0600, when `create`)."""
    if settings.secret_key:
        return _fernet(settings.secret_key.encode("ascii", "replace"), "RSNOTIFY_SECRET_KEY / --secret-key")
    path = settings.data_path / KEY_FILE
    if path.exists():
        return _fernet(path.read_bytes().strip(), str(path))
    if not create:
        raise SettingsError(f"no secret key: give --secret-key (RSNOTIFY_SECRET_KEY) or create {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    key = Fernet.generate_key()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process of this hub created it a moment ago
        return _fernet(_read_new_key(path), str(path))
    with os.fdopen(fd, "wb") as handle:
        handle.write(key + b"\n")
    return Fernet(key)


def _read_new_key(path: Path, wait: float = 2.0) -> bytes:
    """The key another process is writing right now (it may still be empty for an instant)."""
    deadline = time.monotonic() + wait
    while not (key := path.read_bytes().strip()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return key


def _fernet(key: bytes, source: str) -> Fernet:
    try:
        return Fernet(key)
    except (ValueError, TypeError):
        raise SettingsError(f"the secret key from {source} is not a Fernet key "
                            "(32 url-safe base64-encoded bytes, e.g. from `Fernet.generate_key()`)") from None


def encrypt_secret(fernet: Fernet, secret: str | None) -> str:
    """The stored form of a secret: its Fernet token, or "" for no secret."""
    return fernet.encrypt(secret.encode("utf-8")).decode("ascii") if secret else ""


def decrypt_secret(fernet: Fernet, token: str | bytes) -> str | None:
    """The plain secret of a stored token ("" -> None). Raises SettingsError for a token of another key."""
    if not token:
        return None
    try:
        return fernet.decrypt(token if isinstance(token, bytes) else token.encode("ascii")).decode("utf-8")
    except InvalidToken:
        raise SettingsError("a stored secret cannot be decrypted with this secret key: every process "
                            "of the hub needs the same --secret-key") from None


async def check_key_matches(redis: Redis, fernet: Fernet) -> None:
    """Make sure this Redis's secrets were encrypted with `fernet`'s key (records it on first use).

    Raises SettingsError when another key was used, so a mismatch shows at start, not on first delivery.
    """
    token = await store.key_check_token(redis, fernet.encrypt(_KEY_CHECK_PLAINTEXT))
    try:
        fernet.decrypt(token or b"")
    except (InvalidToken, TypeError):
        raise SettingsError("this Redis holds secrets encrypted with a different secret key: give the hub's "
                            "key with --secret-key / RSNOTIFY_SECRET_KEY (or use the same --data-dir)") from None
